#include "testkit/failover_load.h"

#include <uv.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <fstream>
#include <map>
#include <sstream>

#include "http/client.h"

namespace wsup::test {

using nlohmann::json;

int64_t NowUs() {
  return std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

const char* OutcomeName(Outcome o) {
  switch (o) {
    case Outcome::kOk: return "ok";
    case Outcome::kFailed: return "failed";
    case Outcome::kLost: return "lost";
    case Outcome::kDuplicated: return "duplicated";
    case Outcome::kWrong: return "wrong";
  }
  return "?";
}

namespace {

// The first `n` code points of UTF-8 `s` (each token is one code point).
std::string Utf8Prefix(const std::string& s, int n) {
  size_t i = 0;
  for (int k = 0; k < n && i < s.size(); ++k) {
    ++i;
    while (i < s.size() && (static_cast<unsigned char>(s[i]) & 0xC0) == 0x80) ++i;
  }
  return s.substr(0, i);
}

}  // namespace

int ShortestPromptCase(const std::vector<GoldenCase>& golden) {
  size_t best = 0;
  for (size_t i = 1; i < golden.size(); ++i) {
    if (golden[i].prompt.size() < golden[best].prompt.size()) best = i;
  }
  return static_cast<int>(best);
}

Result<std::vector<GoldenCase>> LoadGolden(const std::string& path) {
  std::ifstream in(path);
  if (!in) return NotFound(path + ": cannot open the golden outputs; pass the checkpoint's golden.json");
  json g = json::parse(in, nullptr, false);
  if (g.is_discarded() || !g.contains("cases") || !g["cases"].is_array() || g["cases"].empty()) {
    return InvalidArgument(path + ": not a golden.json with a non-empty \"cases\" array");
  }
  std::vector<GoldenCase> out;
  for (const auto& c : g["cases"]) {
    GoldenCase gc;
    gc.prompt = c.value("prompt", "");
    gc.output_ids = c.value("output_ids", std::vector<int>{});
    // The engines render token t as U+00tt; golden.json has the same text.
    gc.text = c.value("output_text_latin1", "");
    if (gc.prompt.empty() || gc.output_ids.empty()) {
      return InvalidArgument(path + ": a case without prompt or output_ids");
    }
    out.push_back(std::move(gc));
  }
  return out;
}

// ---------------------------------------------------------------------------
// LoadGenerator

class LoadGenerator::Impl {
 public:
  explicit Impl(LoadGenerator* owner) : owner_(owner) {
    uv_loop_init(&loop_);
    client_ = std::make_unique<http::HttpClient>(&loop_);
    uv_async_init(&loop_, &stop_async_, [](uv_async_t* a) { static_cast<Impl*>(a->data)->OnStop(); });
    stop_async_.data = this;
  }

  void Run() {
    int n = owner_->options_.clients;
    seq_.assign(static_cast<size_t>(n), 0);
    if (owner_->options_.think_ms > 0) {
      for (int i = 0; i < n; ++i) {
        auto t = std::make_unique<Think>();
        uv_timer_init(&loop_, &t->timer);
        t->timer.data = t.get();
        t->impl = this;
        t->client = i;
        think_.push_back(std::move(t));
      }
    }
    for (int i = 0; i < n; ++i) Next(i);
    if (owner_->options_.probe_interval_ms > 0) {
      uv_timer_init(&loop_, &probe_timer_);
      probe_timer_.data = this;
      // Ticks at the burst spacing; steady probes go out every probe_interval_ms.
      uint64_t tick = static_cast<uint64_t>(
          std::max<int64_t>(1, std::min(owner_->options_.probe_burst_interval_ms, owner_->options_.probe_interval_ms)));
      uv_timer_start(
          &probe_timer_, [](uv_timer_t* t) { static_cast<Impl*>(t->data)->Tick(); }, tick, tick);
      probing_ = true;
    }
    uv_run(&loop_, UV_RUN_DEFAULT);
    client_.reset();
    uv_run(&loop_, UV_RUN_DEFAULT);  // close callbacks
    uv_loop_close(&loop_);
  }

  void RequestStop() { uv_async_send(&stop_async_); }

 private:
  struct Stream {
    std::string text;
    int events = 0;     // events with a choice
    int done = 0;       // [DONE] seen
    int64_t first_correct_us = 0;
    std::vector<int64_t> event_us;  // each event with text, while the text is still correct
    bool bad_event = false;
    std::string bad;
  };

  // A client's pause before its next request.
  struct Think {
    uv_timer_t timer;
    Impl* impl = nullptr;
    int client = 0;
  };

  void OnStop() {
    stopping_ = true;
    for (auto& t : think_) uv_close(reinterpret_cast<uv_handle_t*>(&t->timer), nullptr);
    if (probing_) {
      probing_ = false;
      uv_close(reinterpret_cast<uv_handle_t*>(&probe_timer_), nullptr);
    }
    MaybeEnd();
  }

  void Tick() {
    int64_t now = NowUs();
    bool burst = now < owner_->burst_until_us_.load();
    if (!burst && now - last_probe_us_ < owner_->options_.probe_interval_ms * 1000) return;
    last_probe_us_ = now;
    Probe();
  }

  void Probe() {
    if (stopping_) return;
    const auto& golden = owner_->golden_;
    const int fixed = owner_->options_.probe_case;
    int g = fixed >= 0 && static_cast<size_t>(fixed) < golden.size() ? fixed
                                                                      : static_cast<int>(probe_seq_++ % golden.size());
    Send(-1, g, true, owner_->options_.probe_tokens,
         Utf8Prefix(golden[static_cast<size_t>(g)].text, owner_->options_.probe_tokens));
  }

  void MaybeEnd() {
    if (stopping_ && in_flight_ == 0 && !closed_) {
      closed_ = true;
      uv_close(reinterpret_cast<uv_handle_t*>(&stop_async_), nullptr);
    }
  }

  void Next(int client) {
    if (stopping_) {
      MaybeEnd();
      return;
    }
    const auto& golden = owner_->golden_;
    int g = static_cast<int>((static_cast<size_t>(client) + seq_[static_cast<size_t>(client)]++) % golden.size());
    Send(client, g, owner_->options_.all_stream || client % 2 == 0, owner_->options_.max_tokens, golden[static_cast<size_t>(g)].text);
  }

  // One request; `want` is the text a correct answer has.
  void Send(int client, int g, bool stream, int max_tokens, std::string want_text) {
    const auto& golden = owner_->golden_;
    const LoadOptions& o = owner_->options_;
    json body{{"prompt", golden[static_cast<size_t>(g)].prompt},
              {"max_tokens", max_tokens},
              {"temperature", 0},
              {"stream", stream}};
    http::ClientRequest req;
    req.method = "POST";
    req.target = "/v1/completions";
    req.headers.push_back({"Content-Type", "application/json"});
    req.body = body.dump();
    req.timeout_ms = o.request_timeout_ms;
    auto st = std::make_shared<Stream>();
    auto want = std::make_shared<const std::string>(std::move(want_text));
    if (stream) {
      req.on_event = [st, want](const http::ServerSentEvent& ev) {
        if (ev.data == "[DONE]") {
          ++st->done;
          return;
        }
        json e = json::parse(ev.data, nullptr, false);
        if (e.is_discarded() || !e.contains("choices") || !e["choices"].is_array()) {
          st->bad_event = true;
          st->bad = "an event that is not a completion chunk: " + ev.data.substr(0, 120);
          return;
        }
        if (e["choices"].empty()) return;  // a usage-only event
        const json& c = e["choices"][0];
        if (c.contains("text") && c["text"].is_string()) st->text += c["text"].get<std::string>();
        ++st->events;
        if (!st->text.empty() && want->compare(0, st->text.size(), st->text) == 0) {
          const int64_t now = NowUs();
          if (st->first_correct_us == 0) st->first_correct_us = now;
          st->event_us.push_back(now);
        }
      };
    }
    auto rec = std::make_shared<RequestRecord>();
    rec->client = client;
    rec->stream = stream;
    rec->golden = g;
    rec->start_us = NowUs();
    ++in_flight_;
    client_->Send(o.host, o.port, std::move(req), [this, rec, st, client, want](Result<http::HttpResponse> r) {
      rec->end_us = NowUs();
      Classify(r, *st, *want, rec.get());
      --in_flight_;
      owner_->completed_.fetch_add(1);
      if (rec->outcome != Outcome::kOk) owner_->not_ok_.fetch_add(1);
      {
        std::lock_guard<std::mutex> lock(owner_->mu_);
        owner_->records_.push_back(std::move(*rec));
      }
      if (client >= 0 && !think_.empty() && !stopping_) {
        uv_timer_start(
            &think_[static_cast<size_t>(client)]->timer,
            [](uv_timer_t* t) {
              auto* th = static_cast<Think*>(t->data);
              th->impl->Next(th->client);
            },
            static_cast<uint64_t>(owner_->options_.think_ms), 0);
      } else if (client >= 0) {
        Next(client);
      } else {
        MaybeEnd();
      }
    });
  }

  void Classify(const Result<http::HttpResponse>& r, const Stream& st, const std::string& want, RequestRecord* rec) {
    if (!r.ok()) {
      const std::string& m = r.error().message();
      // A refused connect never reached the proxy: an error the client sees
      // at once. Anything else (cut, reset, timeout) is a request that got
      // no complete answer.
      rec->outcome = r.error().code() == Code::kUnavailable ? Outcome::kFailed : Outcome::kLost;
      rec->detail = m;
      return;
    }
    rec->status = r->status;
    if (r->status != 200) {
      rec->outcome = Outcome::kFailed;
      rec->detail = "status " + std::to_string(r->status) + ": " + r->body.substr(0, 200);
      return;
    }
    std::string text;
    if (rec->stream) {
      if (st.bad_event) {
        rec->outcome = Outcome::kWrong;
        rec->detail = st.bad;
        return;
      }
      if (st.done == 0) {
        // A 200 stream that ended without [DONE]: an HTTP/1.1 chunked stream
        // cannot end cleanly without it unless the proxy framed it wrong.
        rec->outcome = Outcome::kLost;
        rec->detail = "the stream ended without data: [DONE] after " + std::to_string(st.events) + " events";
        return;
      }
      if (st.done > 1) {
        rec->outcome = Outcome::kDuplicated;
        rec->detail = "data: [DONE] came " + std::to_string(st.done) + " times";
        return;
      }
      text = st.text;
    } else {
      json j = json::parse(r->body, nullptr, false);
      if (j.is_discarded() || !j.contains("choices") || !j["choices"].is_array() || j["choices"].empty() ||
          !j["choices"][0].contains("text") || !j["choices"][0]["text"].is_string()) {
        rec->outcome = Outcome::kWrong;
        rec->detail = "not a completion: " + r->body.substr(0, 200);
        return;
      }
      text = j["choices"][0]["text"].get<std::string>();
    }
    if (text == want) {
      rec->outcome = Outcome::kOk;
      rec->first_correct_us = rec->stream ? st.first_correct_us : rec->end_us;
      if (rec->stream) rec->event_us = st.event_us;
      return;
    }
    rec->outcome = text.size() > want.size() ? Outcome::kDuplicated : Outcome::kWrong;
    rec->detail = "text differs from the golden output (" + std::to_string(text.size()) + " bytes, expected " +
                  std::to_string(want.size()) + ")";
  }

  LoadGenerator* owner_;
  uv_loop_t loop_;
  uv_async_t stop_async_;
  uv_timer_t probe_timer_;
  bool probing_ = false;
  uint64_t probe_seq_ = 0;
  int64_t last_probe_us_ = 0;
  std::unique_ptr<http::HttpClient> client_;
  std::vector<uint64_t> seq_;
  std::vector<std::unique_ptr<Think>> think_;
  int in_flight_ = 0;
  bool stopping_ = false;
  bool closed_ = false;
};

LoadGenerator::LoadGenerator(LoadOptions options, std::vector<GoldenCase> golden)
    : options_(std::move(options)), golden_(std::move(golden)) {}

LoadGenerator::~LoadGenerator() { Stop(); }

void LoadGenerator::Start() {
  if (impl_) return;
  impl_ = std::make_unique<Impl>(this);
  thread_ = std::thread([this] { impl_->Run(); });
}

void LoadGenerator::Stop() {
  if (!impl_ || !thread_.joinable()) return;
  impl_->RequestStop();
  thread_.join();
}

void LoadGenerator::BurstProbes() { burst_until_us_ = NowUs() + options_.probe_burst_ms * 1000; }

int64_t LoadGenerator::FirstOkSince(int64_t since_us) const {
  std::lock_guard<std::mutex> lock(mu_);
  // Records are in completion order: only the tail can have started after since_us.
  int64_t best = 0;
  for (auto it = records_.rbegin(); it != records_.rend() && it->end_us >= since_us; ++it) {
    if (it->outcome == Outcome::kOk && it->start_us >= since_us && (best == 0 || it->end_us < best)) best = it->end_us;
  }
  return best;
}

// ---------------------------------------------------------------------------
// Analysis

double Percentile(std::vector<double> v, double p) {
  if (v.empty()) return -1;
  std::sort(v.begin(), v.end());
  size_t rank = static_cast<size_t>(std::ceil(p / 100.0 * static_cast<double>(v.size())));
  if (rank < 1) rank = 1;
  return v[std::min(rank, v.size()) - 1];
}

json Analyze(const std::vector<DrillRecord>& drills, const std::vector<RequestRecord>& records) {
  struct Window {
    std::map<std::string, int64_t> counts;
    int64_t first_ok_us = -1;       // first complete correct answer
    int64_t first_correct_us = -1;  // first correct token or answer
  };
  std::vector<double> lat_plain, lat_stream_first, lat_stream_end, lat_probe;
  std::vector<Window> win(drills.size());
  Window before;
  std::map<std::string, int64_t> total;
  json failures = json::array();
  std::vector<int> window_of(records.size(), -1);
  for (size_t ri = 0; ri < records.size(); ++ri) {
    const RequestRecord& r = records[ri];
    // The latest drill that began at or before the end of this request.
    int idx = -1;
    for (size_t i = 0; i < drills.size(); ++i) {
      if (drills[i].t0_us <= r.end_us) idx = static_cast<int>(i);
    }
    window_of[ri] = idx;
    Window& w = idx < 0 ? before : win[static_cast<size_t>(idx)];
    std::string o = OutcomeName(r.outcome);
    ++w.counts["requests"];
    ++w.counts[o];
    ++total["requests"];
    ++total[o];
    if (r.stream && r.client >= 0) ++total["streams"];
    if (r.outcome != Outcome::kOk && failures.size() < 50) {
      failures.push_back({{"drill", idx},
                          {"outcome", o},
                          {"stream", r.stream},
                          {"status", r.status},
                          {"detail", r.detail},
                          {"ms_after_drill", idx < 0 ? 0.0 : (r.end_us - drills[static_cast<size_t>(idx)].t0_us) / 1e3}});
    }
    if (idx >= 0 && r.outcome == Outcome::kOk && r.start_us >= drills[static_cast<size_t>(idx)].t0_us) {
      if (r.client >= 0 && (w.first_ok_us < 0 || r.end_us < w.first_ok_us)) w.first_ok_us = r.end_us;
      if (r.first_correct_us > 0 && (w.first_correct_us < 0 || r.first_correct_us < w.first_correct_us)) {
        w.first_correct_us = r.first_correct_us;
      }
    }
    if (r.client < 0) ++total["probes"];
    if (idx < 0 && r.outcome == Outcome::kOk && r.client < 0) {
      lat_probe.push_back((r.first_correct_us - r.start_us) / 1e3);
    } else if (idx < 0 && r.outcome == Outcome::kOk) {
      if (r.stream) {
        lat_stream_first.push_back((r.first_correct_us - r.start_us) / 1e3);
        lat_stream_end.push_back((r.end_us - r.start_us) / 1e3);
      } else {
        lat_plain.push_back((r.end_us - r.start_us) / 1e3);
      }
    }
  }
  auto counts_json = [](const std::map<std::string, int64_t>& c) {
    json j = json::object();
    for (const char* k : {"requests", "ok", "failed", "lost", "duplicated", "wrong", "streams", "probes"}) {
      auto it = c.find(k);
      j[k] = it == c.end() ? 0 : it->second;
    }
    return j;
  };
  // What a drill cost each client request: its latency past the undisturbed
  // median of its kind (plain, or a whole stream), largest per window.
  const double base_plain = Percentile(lat_plain, 50), base_stream = Percentile(lat_stream_end, 50);
  std::vector<double> extra_max(drills.size(), 0);
  std::vector<json> extra_worst(drills.size(), json(nullptr));
  for (size_t ri = 0; ri < records.size(); ++ri) {
    const RequestRecord& r = records[ri];
    if (window_of[ri] < 0 || r.client < 0 || r.outcome != Outcome::kOk) continue;
    double base = r.stream ? base_stream : base_plain;
    if (base < 0) continue;
    double extra = (r.end_us - r.start_us) / 1e3 - base;
    const size_t w = static_cast<size_t>(window_of[ri]);
    if (extra > extra_max[w]) {
      extra_max[w] = extra;
      extra_worst[w] = {{"stream", r.stream},
                        {"sent_ms_after_drill", (r.start_us - drills[w].t0_us) / 1e3},
                        {"ms", (r.end_us - r.start_us) / 1e3}};
    }
  }
  // The first correct output any client got after a drill began, other
  // than what was already on its way (within kInFlightUs of t0): an answer
  // or a stream's first token for a request sent after t0; for one in
  // flight at t0, a stream's first token after it (its output resumed on
  // another engine, or a hedge's), else its end. With hedging, answers to
  // requests caught by a hang count: that is when the clients' outage ended.
  constexpr int64_t kInFlightUs = 10'000;
  std::vector<int64_t> first_output(drills.size(), -1);
  for (size_t ri = 0; ri < records.size(); ++ri) {
    const RequestRecord& r = records[ri];
    if (window_of[ri] < 0 || r.outcome != Outcome::kOk) continue;
    const size_t w = static_cast<size_t>(window_of[ri]);
    const int64_t from = drills[w].t0_us + kInFlightUs;
    int64_t at = r.first_correct_us >= from ? r.first_correct_us : -1;
    for (size_t k = 0; at < 0 && k < r.event_us.size(); ++k) {
      if (r.event_us[k] >= from) at = r.event_us[k];
    }
    if (at < 0) at = r.end_us;
    if (at < from) continue;
    if (first_output[w] < 0 || at < first_output[w]) first_output[w] = at;
  }
  json per = json::array();
  std::map<std::string, std::vector<double>> swap, first_ok, first_correct, extra;
  std::map<std::string, std::map<std::string, int64_t>> by_kind;
  for (size_t i = 0; i < drills.size(); ++i) {
    const DrillRecord& d = drills[i];
    json row = counts_json(win[i].counts);
    row["kind"] = d.kind;
    row["swap_ms"] = d.swap_us < 0 ? json(nullptr) : json((d.swap_us - d.t0_us) / 1e3);
    row["swap_source"] = d.swap_source;
    row["first_ok_ms"] = win[i].first_ok_us < 0 ? json(nullptr) : json((win[i].first_ok_us - d.t0_us) / 1e3);
    row["first_correct_ms"] =
        win[i].first_correct_us < 0 ? json(nullptr) : json((win[i].first_correct_us - d.t0_us) / 1e3);
    row["resumed"] = d.resumed;
    row["retried"] = d.retried;
    row["first_output_ms"] = first_output[i] < 0 ? json(nullptr) : json((first_output[i] - d.t0_us) / 1e3);
    row["extra_ms_max"] = extra_max[i];
    row["extra_worst"] = extra_worst[i];
    extra[d.kind].push_back(extra_max[i]);
    if (!d.note.empty()) row["note"] = d.note;
    per.push_back(row);
    if (d.swap_us >= 0) swap[d.kind].push_back((d.swap_us - d.t0_us) / 1e3);
    // A drill with no correct answer in its window counts as the window's
    // length: the service did not recover within it.
    first_ok[d.kind].push_back(row["first_ok_ms"].is_null() ? 1e9 : row["first_ok_ms"].get<double>());
    first_correct[d.kind].push_back(row["first_correct_ms"].is_null() ? 1e9 : row["first_correct_ms"].get<double>());
    auto& k = by_kind[d.kind];
    ++k["drills"];
    for (const auto& [name, n] : win[i].counts) k[name] += n;
    k["resumed"] += d.resumed;
    k["retried"] += d.retried;
    if (d.swap_us < 0) ++k["swap_unseen"];
    if (win[i].first_ok_us < 0) ++k["no_first_ok"];
  }
  json summary = json::object();
  for (auto& [kind, k] : by_kind) {
    json s = counts_json(k);
    for (const char* f : {"drills", "resumed", "retried", "swap_unseen", "no_first_ok"}) s[f] = k[f];
    s["swap_ms_p50"] = Percentile(swap[kind], 50);
    s["swap_ms_p99"] = Percentile(swap[kind], 99);
    s["first_ok_ms_p50"] = Percentile(first_ok[kind], 50);
    s["first_ok_ms_p99"] = Percentile(first_ok[kind], 99);
    s["first_correct_ms_p50"] = Percentile(first_correct[kind], 50);
    s["first_correct_ms_p99"] = Percentile(first_correct[kind], 99);
    s["extra_ms_max"] = Percentile(extra[kind], 100);
    summary[kind] = s;
  }
  json latency = {{"plain_ms_p50", Percentile(lat_plain, 50)},
                  {"plain_ms_p99", Percentile(lat_plain, 99)},
                  {"stream_first_token_ms_p50", Percentile(lat_stream_first, 50)},
                  {"stream_first_token_ms_p99", Percentile(lat_stream_first, 99)},
                  {"stream_ms_p50", Percentile(lat_stream_end, 50)},
                  {"stream_ms_p99", Percentile(lat_stream_end, 99)},
                  {"probe_first_token_ms_p50", Percentile(lat_probe, 50)},
                  {"probe_first_token_ms_p99", Percentile(lat_probe, 99)}};
  return {{"drills", per},
          {"latency_before_drills", latency},
          {"by_kind", summary},
          {"before_drills", counts_json(before.counts)},
          {"total", counts_json(total)},
          {"not_ok_examples", failures}};
}

json RecordsJson(const std::vector<RequestRecord>& records, int64_t origin_us) {
  json a = json::array();
  for (const auto& r : records) {
    a.push_back({{"client", r.client},
                 {"stream", r.stream},
                 {"case", r.golden},
                 {"start_ms", (r.start_us - origin_us) / 1e3},
                 {"end_ms", (r.end_us - origin_us) / 1e3},
                 {"first_correct_ms", r.first_correct_us ? (r.first_correct_us - origin_us) / 1e3 : -1.0},
                 {"outcome", OutcomeName(r.outcome)},
                 {"status", r.status},
                 {"detail", r.detail}});
  }
  return a;
}

}  // namespace wsup::test
