#include "probes/probe.h"

#include <optional>

#include <nlohmann/json.hpp>

#include "common/json_limits.h"
#include "http/control_auth.h"

namespace wsup {
namespace {

// The length of the valid UTF-8 sequence at s[i], or 0 when there is none.
size_t Utf8Length(const std::string& s, size_t i) {
  const auto b = [&](size_t k) { return static_cast<unsigned char>(s[k]); };
  const unsigned char c = b(i);
  if (c < 0x80) return 1;
  size_t n = c >= 0xc2 && c <= 0xdf ? 2 : c >= 0xe0 && c <= 0xef ? 3 : c >= 0xf0 && c <= 0xf4 ? 4 : 0;
  if (n == 0 || i + n > s.size()) return 0;
  for (size_t k = 1; k < n; ++k) {
    if ((b(i + k) & 0xc0) != 0x80) return 0;
  }
  // No overlong forms, surrogates or code points past U+10FFFF.
  if ((c == 0xe0 && b(i + 1) < 0xa0) || (c == 0xed && b(i + 1) > 0x9f) || (c == 0xf0 && b(i + 1) < 0x90) ||
      (c == 0xf4 && b(i + 1) > 0x8f)) {
    return 0;
  }
  return n;
}

// A short, single-line excerpt of a body for a reason string. The body is
// the engine's bytes: anything that is not UTF-8 becomes '?', so that the
// reason can go into any JSON answer (`wsup status`, the ledger's rows).
std::string Excerpt(const std::string& body, size_t max = 200) {
  std::string s;
  for (size_t i = 0; i < body.size();) {
    if (s.size() >= max) {
      s += "...";
      break;
    }
    const size_t n = Utf8Length(body, i);
    if (n == 0) {
      s += '?';
      ++i;
    } else if (n == 1) {
      s += (body[i] == '\n' || body[i] == '\r') ? ' ' : body[i];
      ++i;
    } else {
      s.append(body, i, n);
      i += n;
    }
  }
  while (!s.empty() && s.back() == ' ') s.pop_back();
  return s;
}

std::string IdList(const std::vector<int64_t>& ids) {
  std::string s = "[";
  for (size_t i = 0; i < ids.size(); ++i) s += (i ? ", " : "") + std::to_string(ids[i]);
  return s + "]";
}

ProbeOutcome Fail(std::string reason, int64_t latency_ms) { return {false, std::move(reason), latency_ms}; }

// Parses an answer's body into *out, a JSON object; otherwise the outcome
// that fails the probe. `bad` starts the failure ("bad status"), `what`
// names the body and `fix` ends the message when it is past the limits.
std::optional<ProbeOutcome> ParseObject(const std::string& body, const std::string& bad, const std::string& what,
                                        std::string_view fix, int64_t latency_ms, nlohmann::json* out) {
  if (Status limits = CheckJsonLimits(body, bad + ": " + what, fix); !limits.ok()) {
    return Fail(limits.error().message(), latency_ms);
  }
  *out = nlohmann::json::parse(body, nullptr, false);
  if (out->is_discarded() || !out->is_object()) {
    return Fail(bad + ": not a JSON object: " + Excerpt(body, 80), latency_ms);
  }
  return std::nullopt;
}

// A non-2xx answer: "HTTP 503: <the error message, or the body>".
std::string HttpFailure(const http::HttpResponse& r) {
  std::string detail = Excerpt(r.body);
  if (!CheckJsonLimits(r.body, "the error answer", "").ok()) return "HTTP " + std::to_string(r.status) + ": " + detail;
  auto j = nlohmann::json::parse(r.body, nullptr, false);
  if (!j.is_discarded() && j.is_object() && j.contains("error")) {
    const auto& e = j["error"];
    if (e.is_object() && e.contains("message") && e["message"].is_string()) detail = Excerpt(e["message"].get<std::string>());
    else if (e.is_string()) detail = Excerpt(e.get<std::string>());
  }
  return "HTTP " + std::to_string(r.status) + (detail.empty() ? "" : ": " + detail);
}

// --- HTTP probes -----------------------------------------------------------

class HttpProbe : public Probe {
 public:
  HttpProbe(http::HttpClient& client, ProbeTarget target, const Clock& clock)
      : client_(client), target_(std::move(target)), clock_(clock) {}
  ~HttpProbe() override { Cancel(); }

  void Cancel() override {
    if (!in_flight_) return;
    cancelled_ = true;
    client_.Cancel(id_);  // runs our callback at once; it sees cancelled_
    in_flight_ = false;
  }

 protected:
  void Send(http::ClientRequest req, std::function<ProbeOutcome(const Result<http::HttpResponse>&, int64_t)> judge,
            Callback done) {
    if (in_flight_) Cancel();
    int64_t start_us = clock_.MonotonicUs();
    in_flight_ = true;
    cancelled_ = false;
    id_ = client_.Send(target_.host, target_.port, std::move(req),
                       [this, start_us, judge = std::move(judge), done = std::move(done)](const Result<http::HttpResponse>& r) {
                         if (cancelled_) return;
                         in_flight_ = false;
                         int64_t latency_ms = (clock_.MonotonicUs() - start_us) / 1000;
                         done(judge(r, latency_ms));
                       });
  }

  http::HttpClient& client_;
  ProbeTarget target_;
  const Clock& clock_;
  http::HttpClient::RequestId id_ = 0;
  bool in_flight_ = false;
  bool cancelled_ = false;
};

class SemanticProbe : public HttpProbe {
 public:
  SemanticProbe(http::HttpClient& client, ProbeTarget target, SemanticProbeSpec spec, const Clock& clock)
      : HttpProbe(client, std::move(target), clock), spec_(std::move(spec)), body_(SemanticRequestBody(spec_)) {}
  const char* kind() const override { return "semantic"; }
  void Run(Callback done) override {
    http::ClientRequest req;
    req.method = "POST";
    req.target = "/v1/completions";
    req.headers = {{"Content-Type", "application/json"}, {"X-Wsup-Probe", "semantic"}};
    // With the engine's control token, a wsup engine admits the probe ahead
    // of its queue: its latency then measures health, not load.
    if (!target_.control_token.empty()) req.headers.push_back(http::ControlAuthHeader(target_.control_token));
    req.body = body_;
    req.timeout_ms = spec_.timeout_ms;
    req.max_body_bytes = 1 << 20;
    Send(std::move(req),
         [this](const Result<http::HttpResponse>& r, int64_t ms) { return EvaluateCompletion(spec_, r, ms); },
         std::move(done));
  }

 private:
  SemanticProbeSpec spec_;
  std::string body_;
};

class CommProbe : public HttpProbe {
 public:
  CommProbe(http::HttpClient& client, ProbeTarget target, CommProbeSpec spec, const Clock& clock)
      : HttpProbe(client, std::move(target), clock), spec_(spec) {}
  const char* kind() const override { return "comm"; }
  void Run(Callback done) override {
    http::ClientRequest req;
    req.target = "/wsup/status";
    req.headers = {{"X-Wsup-Probe", "comm"}};
    if (!target_.control_token.empty()) req.headers.push_back(http::ControlAuthHeader(target_.control_token));
    req.timeout_ms = spec_.timeout_ms;
    req.max_body_bytes = 1 << 20;
    Send(std::move(req),
         [this](const Result<http::HttpResponse>& r, int64_t ms) {
           return EvaluateStatus(spec_, r, ms);
         },
         std::move(done));
  }

 private:
  CommProbeSpec spec_;
};

// --- port probe: a TCP connect ---------------------------------------------

class PortProbe : public Probe {
 public:
  PortProbe(uv_loop_t* loop, ProbeTarget target, int64_t timeout_ms, const Clock& clock)
      : loop_(loop), target_(std::move(target)), timeout_ms_(timeout_ms), clock_(clock) {}
  ~PortProbe() override { Cancel(); }
  const char* kind() const override { return "port"; }

  void Run(Callback done) override {
    Cancel();
    attempt_ = new Attempt(this, std::move(done));
    attempt_->Start();
  }

  void Cancel() override {
    if (!attempt_) return;
    Attempt* a = attempt_;
    attempt_ = nullptr;
    a->Abandon();
  }

 private:
  // One connect: a tcp and a timer handle, freed when both have closed.
  struct Attempt {
    Attempt(PortProbe* owner, Callback done) : owner(owner), done(std::move(done)) {
      tcp.data = this;
      timer.data = this;
      connect.data = this;
    }

    void Start() {
      uv_tcp_init(owner->loop_, &tcp);
      uv_timer_init(owner->loop_, &timer);
      start_us = owner->clock_.MonotonicUs();
      uv_timer_start(&timer, &Attempt::OnTimeout, static_cast<uint64_t>(owner->timeout_ms_), 0);
      sockaddr_storage addr{};
      std::string host = owner->target_.host == "localhost" ? "127.0.0.1" : owner->target_.host;
      if (uv_ip4_addr(host.c_str(), owner->target_.port, reinterpret_cast<sockaddr_in*>(&addr)) != 0 &&
          uv_ip6_addr(host.c_str(), owner->target_.port, reinterpret_cast<sockaddr_in6*>(&addr)) != 0) {
        pending_reason = "\"" + owner->target_.host + "\" is not an IP address";
        uv_timer_start(&timer, &Attempt::OnTimeout, 0, 0);
        return;
      }
      int rc = uv_tcp_connect(&connect, &tcp, reinterpret_cast<const sockaddr*>(&addr), &Attempt::OnConnect);
      if (rc < 0) {
        pending_reason = Reason(rc);
        uv_timer_start(&timer, &Attempt::OnTimeout, 0, 0);
      }
    }

    static std::string Reason(int rc) {
      if (rc == UV_ECONNREFUSED) return "connection refused";
      return std::string("cannot connect: ") + uv_strerror(rc);
    }

    void Finish(ProbeOutcome outcome) {
      if (finished) return;
      finished = true;
      Callback cb = std::move(done);
      PortProbe* o = owner;
      if (o && o->attempt_ == this) o->attempt_ = nullptr;
      owner = nullptr;
      Close();
      if (cb) cb(std::move(outcome));
    }

    void Abandon() {
      finished = true;
      done = nullptr;
      owner = nullptr;
      Close();
    }

    void Close() {
      if (closing) return;
      closing = true;
      uv_close(reinterpret_cast<uv_handle_t*>(&timer), &Attempt::OnClosed);
      uv_close(reinterpret_cast<uv_handle_t*>(&tcp), &Attempt::OnClosed);
    }

    static void OnClosed(uv_handle_t* h) {
      auto* self = static_cast<Attempt*>(h->data);
      if (--self->open == 0) delete self;
    }

    int64_t LatencyMs() const { return owner ? (owner->clock_.MonotonicUs() - start_us) / 1000 : 0; }

    static void OnTimeout(uv_timer_t* t) {
      auto* self = static_cast<Attempt*>(t->data);
      if (self->finished) return;
      int64_t ms = self->LatencyMs();
      if (!self->pending_reason.empty()) {
        self->Finish(Fail(self->pending_reason, ms));
        return;
      }
      self->Finish(Fail("timeout after " + std::to_string(self->owner->timeout_ms_) + " ms", ms));
    }

    static void OnConnect(uv_connect_t* c, int status) {
      auto* self = static_cast<Attempt*>(c->data);
      if (self->finished) return;
      int64_t ms = self->LatencyMs();
      if (status < 0) {
        self->Finish(Fail(Reason(status), ms));
        return;
      }
      self->Finish({true, "", ms});
    }

    PortProbe* owner;
    Callback done;
    uv_tcp_t tcp{};
    uv_timer_t timer{};
    uv_connect_t connect{};
    int open = 2;
    bool finished = false;
    bool closing = false;
    int64_t start_us = 0;
    std::string pending_reason;
  };

  uv_loop_t* loop_;
  ProbeTarget target_;
  int64_t timeout_ms_;
  const Clock& clock_;
  Attempt* attempt_ = nullptr;
};

// --- all-of ---------------------------------------------------------------

class AllOfProbe : public Probe {
 public:
  explicit AllOfProbe(std::vector<std::unique_ptr<Probe>> probes) : probes_(std::move(probes)) {}
  const char* kind() const override { return "all"; }
  void Run(Callback done) override {
    done_ = std::move(done);
    latency_ms_ = 0;
    Step(0);
  }
  void Cancel() override {
    for (auto& p : probes_) p->Cancel();
    done_ = nullptr;
  }

 private:
  void Step(size_t i) {
    if (i >= probes_.size()) {
      auto done = std::move(done_);
      if (done) done({true, "", latency_ms_});
      return;
    }
    probes_[i]->Run([this, i](ProbeOutcome o) {
      latency_ms_ += o.latency_ms;
      if (!o.ok) {
        auto done = std::move(done_);
        if (i > 0) o.reason = std::string(probes_[i]->kind()) + ": " + o.reason;
        o.latency_ms = latency_ms_;
        if (done) done(std::move(o));
        return;
      }
      Step(i + 1);
    });
  }

  std::vector<std::unique_ptr<Probe>> probes_;
  Callback done_;
  int64_t latency_ms_ = 0;
};

}  // namespace

std::string ProbeTarget::ToString() const {
  return (host.find(':') != std::string::npos ? "[" + host + "]" : host) + ":" + std::to_string(port);
}

std::string SemanticRequestBody(const SemanticProbeSpec& spec) {
  nlohmann::json j;
  if (!spec.model.empty()) j["model"] = spec.model;
  j["prompt"] = spec.prompt;
  j["max_tokens"] = spec.max_tokens;
  j["temperature"] = 0;
  j["return_token_ids"] = true;
  j["stream"] = false;
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

std::string FailureReason(const Error& error, int64_t timeout_ms) {
  if (error.code() == Code::kTimeout) return "timeout after " + std::to_string(timeout_ms) + " ms";
  const std::string& m = error.message();
  if (m.find("connection refused") != std::string::npos) return "connection refused";
  // Drop the client's "HOST:PORT: METHOD TARGET: " prefix: the probe's owner knows the target.
  size_t at = m.find(": ");
  if (at != std::string::npos) at = m.find(": ", at + 2);
  return at == std::string::npos ? m : m.substr(at + 2);
}

// The failures both probes share: no answer, a non-200 answer, a late one.
static std::optional<ProbeOutcome> FailedExchange(const Result<http::HttpResponse>& response, int64_t timeout_ms,
                                                  int64_t latency_ms) {
  if (!response.ok()) return Fail(FailureReason(response.error(), timeout_ms), latency_ms);
  if (response->status != 200) return Fail(HttpFailure(*response), latency_ms);
  if (latency_ms > timeout_ms)
    return Fail("timeout after " + std::to_string(timeout_ms) + " ms (answered after " +
                    std::to_string(latency_ms) + " ms)",
                latency_ms);
  return std::nullopt;
}

ProbeOutcome EvaluateCompletion(const SemanticProbeSpec& spec, const Result<http::HttpResponse>& response,
                                int64_t latency_ms) {
  if (auto failed = FailedExchange(response, spec.timeout_ms, latency_ms)) return *failed;
  const http::HttpResponse& r = *response;
  nlohmann::json j;
  if (auto bad = ParseObject(r.body, "bad response", "the completion", "the engine must answer the completion API's JSON",
                             latency_ms, &j)) {
    return *bad;
  }
  if (!j.contains("choices") || !j["choices"].is_array() || j["choices"].empty() || !j["choices"][0].is_object())
    return Fail("bad response: no choices[0]", latency_ms);
  const auto& choice = j["choices"][0];
  // What it answered, as far as it said (a wrong answer carries it).
  ProbeAnswer answer;
  bool ids_ok = choice.contains("token_ids") && choice["token_ids"].is_array();
  if (ids_ok) {
    for (const auto& t : choice["token_ids"]) {
      if (!t.is_number_integer()) {
        ids_ok = false;
        break;
      }
      answer.token_ids.push_back(t.get<int64_t>());
    }
  }
  if (choice.contains("text") && choice["text"].is_string()) answer.text = choice["text"].get<std::string>();
  if (choice.contains("finish_reason") && choice["finish_reason"].is_string()) {
    answer.finish_reason = choice["finish_reason"].get<std::string>();
  }
  auto wrong = [&](std::string reason) {
    ProbeOutcome o = Fail(std::move(reason), latency_ms);
    o.wrong_answer = std::move(answer);
    return o;
  };
  if (spec.expect_token_ids) {
    if (!choice.contains("token_ids") || !choice["token_ids"].is_array())
      return Fail("bad response: no choices[0].token_ids; the engine must honour return_token_ids", latency_ms);
    if (!ids_ok) return Fail("bad response: choices[0].token_ids holds a non-integer", latency_ms);
    if (answer.token_ids != *spec.expect_token_ids)
      return wrong("wrong answer: got " + IdList(answer.token_ids) + " expected " + IdList(*spec.expect_token_ids));
    return {true, "", latency_ms};
  }
  if (!choice.contains("text") || !choice["text"].is_string())
    return Fail("bad response: no choices[0].text", latency_ms);
  const std::string want = spec.expect.value_or("");
  if (answer.text != want) {
    auto quote = [](const std::string& s) {
      return nlohmann::json(s).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
    };
    if (!ids_ok) answer.token_ids.clear();
    return wrong("wrong answer: got " + quote(answer.text) + " expected " + quote(want));
  }
  return {true, "", latency_ms};
}

ProbeOutcome EvaluateStatus(const CommProbeSpec& spec, const Result<http::HttpResponse>& response,
                            int64_t latency_ms) {
  if (auto failed = FailedExchange(response, spec.timeout_ms, latency_ms)) return *failed;
  const http::HttpResponse& r = *response;
  nlohmann::json j;
  if (auto bad = ParseObject(r.body, "bad status", "the answer", "the engine must answer /wsup/status JSON", latency_ms,
                             &j)) {
    return *bad;
  }
  if (!j.contains("comm") || !j["comm"].is_object()) return Fail("bad status: no comm object", latency_ms);
  const auto& comm = j["comm"];
  if (!comm.contains("warm") || !comm["warm"].is_boolean()) return Fail("bad status: no comm.warm", latency_ms);
  if (!comm["warm"].get<bool>()) return Fail("comm not warm", latency_ms);
  if (!comm.contains("last_keepalive_ms") || !comm["last_keepalive_ms"].is_number())
    return Fail("bad status: no comm.last_keepalive_ms", latency_ms);
  const int64_t age = comm["last_keepalive_ms"].is_number_integer()
                          ? comm["last_keepalive_ms"].get<int64_t>()
                          : static_cast<int64_t>(comm["last_keepalive_ms"].get<double>());
  if (age > spec.max_age_ms)
    return Fail("comm keepalive stale: last one " + std::to_string(age) + " ms ago (limit " +
                    std::to_string(spec.max_age_ms) + " ms)",
                latency_ms);
  return {true, "", latency_ms};
}

std::unique_ptr<Probe> MakeSemanticProbe(http::HttpClient& client, ProbeTarget target, SemanticProbeSpec spec,
                                         const Clock& clock) {
  return std::make_unique<SemanticProbe>(client, std::move(target), std::move(spec), clock);
}

std::unique_ptr<Probe> MakeCommProbe(http::HttpClient& client, ProbeTarget target, CommProbeSpec spec,
                                     const Clock& clock) {
  return std::make_unique<CommProbe>(client, std::move(target), spec, clock);
}

std::unique_ptr<Probe> MakePortProbe(uv_loop_t* loop, ProbeTarget target, int64_t timeout_ms, const Clock& clock) {
  return std::make_unique<PortProbe>(loop, std::move(target), timeout_ms, clock);
}

std::unique_ptr<Probe> MakeAllOfProbe(std::vector<std::unique_ptr<Probe>> probes) {
  return std::make_unique<AllOfProbe>(std::move(probes));
}

}  // namespace wsup
