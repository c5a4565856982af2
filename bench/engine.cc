// wsup-bench-engine: the engine's startup phases with weights from the
// holder versus from disk, and its decode throughput, measured on real
// processes:
//   1. starts a wsup-holder on the model (its load is timed);
//   2. starts wsup-engine --weight-cache daemon on it: spawn to ready, and
//      the engine's own phase table from /wsup/status;
//   3. decode throughput at each batch size B: B concurrent completions of
//      max_tokens tokens each (no end-of-sequence token exists, so every
//      one runs to the end), tokens/s over the wall time;
//   4. prefill at each --prefill length: one completion of that many
//      token ids and max_tokens 1, best of two: its wall time is the time
//      to first token, and length / time the prefill rate;
//   5. the same engine start with --weight-cache off (the page cache is
//      dropped first when the process may), for the disk column.
// Prints a markdown table (also to --out/engine.md) and the raw JSON.
//
//   wsup-bench-engine --bin-dir build/bin --model DIR --device cuda:0 --out OUTDIR
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace {

using Clock = std::chrono::steady_clock;
using nlohmann::json;

double MsSince(Clock::time_point t0) { return std::chrono::duration<double, std::milli>(Clock::now() - t0).count(); }

[[noreturn]] void Die(const std::string& msg) {
  std::fprintf(stderr, "wsup-bench-engine: %s\n", msg.c_str());
  std::exit(1);
}

struct Proc {
  pid_t pid = -1;
  int port = 0;
  double ready_ms = 0;
  std::string log;
};

// Starts argv with fd 3 as its ready fd and waits (up to limit) for the
// "listening on HOST:PORT" line it writes there once ready.
Proc Start(std::vector<std::string> argv, const std::string& log, std::chrono::seconds limit) {
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) Die("pipe");
  Proc p;
  p.log = log;
  auto t0 = Clock::now();
  p.pid = ::fork();
  if (p.pid == 0) {
    int out = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    ::dup2(out, 1);
    ::dup2(out, 2);
    ::dup2(fds[1], 3);
    std::vector<char*> args;
    for (auto& a : argv) args.push_back(a.data());
    args.push_back(nullptr);
    ::execv(args[0], args.data());
    _exit(127);
  }
  ::close(fds[1]);
  std::string line;
  auto deadline = Clock::now() + limit;
  for (;;) {
    int left = static_cast<int>(std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count());
    pollfd pf{fds[0], POLLIN, 0};
    if (left <= 0 || ::poll(&pf, 1, left) != 1) Die("no ready line from " + argv[0] + " in time; see " + log);
    char c;
    if (::read(fds[0], &c, 1) != 1) Die(argv[0] + " exited before it was ready; see " + log);
    if (c == '\n') break;
    line.push_back(c);
  }
  ::close(fds[0]);
  p.ready_ms = MsSince(t0);
  auto colon = line.rfind(':');
  if (colon != std::string::npos) p.port = std::atoi(line.c_str() + colon + 1);
  return p;
}

void Stop(Proc& p) {
  if (p.pid <= 0) return;
  ::kill(p.pid, SIGTERM);
  int st = 0;
  ::waitpid(p.pid, &st, 0);
  p.pid = -1;
}

// One blocking HTTP/1.1 exchange on loopback; returns the body.
std::string Http(int port, const std::string& method, const std::string& path, const std::string& body) {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) Die("connect to port " + std::to_string(port));
  std::string req = method + " " + path + " HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n";
  if (!body.empty()) req += "Content-Type: application/json\r\nContent-Length: " + std::to_string(body.size()) + "\r\n";
  req += "\r\n" + body;
  if (::send(fd, req.data(), req.size(), MSG_NOSIGNAL) != static_cast<ssize_t>(req.size())) Die("send");
  std::string resp;
  char buf[65536];
  for (;;) {
    ssize_t n = ::recv(fd, buf, sizeof buf, 0);
    if (n <= 0) break;
    resp.append(buf, static_cast<size_t>(n));
  }
  ::close(fd);
  auto split = resp.find("\r\n\r\n");
  if (resp.rfind("HTTP/1.1 200", 0) != 0 || split == std::string::npos) {
    Die(method + " " + path + " failed: " + resp.substr(0, 300));
  }
  return resp.substr(split + 4);
}

json Status(int port) { return json::parse(Http(port, "GET", "/wsup/status", "")); }

struct Throughput {
  int batch = 0;
  double wall_ms = 0;
  uint64_t tokens = 0;
  double tok_s = 0;
  double ms_per_step = 0;
};

Throughput Load(int port, int batch, int max_tokens) {
  const json req = {{"prompt", "The quick brown fox jumps over"}, {"max_tokens", max_tokens}, {"temperature", 0}};
  const std::string body = req.dump();
  std::atomic<uint64_t> tokens{0};
  auto t0 = Clock::now();
  std::vector<std::thread> ts;
  for (int i = 0; i < batch; ++i) {
    ts.emplace_back([&] {
      json r = json::parse(Http(port, "POST", "/v1/completions", body));
      tokens += r["usage"]["completion_tokens"].get<uint64_t>();
    });
  }
  for (auto& t : ts) t.join();
  Throughput t;
  t.batch = batch;
  t.wall_ms = MsSince(t0);
  t.tokens = tokens;
  t.tok_s = static_cast<double>(t.tokens) / (t.wall_ms / 1000.0);
  t.ms_per_step = t.wall_ms / max_tokens;
  return t;
}

struct Prefill {
  int tokens = 0;
  double ms = 0;  // best of two (of one when the first took over kOnceMs)
  int runs = 0;
};
// A prefill slower than this is timed once: a second pass would only
// double a run that is already far from the goal.
constexpr double kOnceMs = 20'000;

// A prompt of n token ids (a fixed pseudo-random sequence below vocab),
// max_tokens 1: the answer comes after the prompt's forward pass and one
// sampled token.
Prefill TimePrefill(int port, int n, int64_t vocab) {
  json ids = json::array();
  uint32_t x = 2463534242u;
  for (int i = 0; i < n; ++i) {
    x ^= x << 13;
    x ^= x >> 17;
    x ^= x << 5;
    ids.push_back(static_cast<int64_t>(x % static_cast<uint32_t>(vocab)));
  }
  const std::string body = json{{"prompt", ids}, {"max_tokens", 1}, {"temperature", 0}}.dump();
  Prefill p;
  p.tokens = n;
  for (int k = 0; k < 2; ++k) {
    auto t0 = Clock::now();
    Http(port, "POST", "/v1/completions", body);
    const double ms = MsSince(t0);
    p.ms = k == 0 ? ms : std::min(p.ms, ms);
    p.runs = k + 1;
    if (ms > kOnceMs) break;
  }
  return p;
}

std::vector<int> IntList(const std::string& s) {
  std::vector<int> v;
  std::stringstream ss(s);
  std::string b;
  while (std::getline(ss, b, ',')) {
    if (!b.empty()) v.push_back(std::stoi(b));
  }
  return v;
}

bool DropCaches() {
  ::sync();
  std::ofstream f("/proc/sys/vm/drop_caches");
  if (!f) return false;
  f << "3\n";
  return static_cast<bool>(f);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"wsup-bench-engine: startup phases (holder vs disk) and decode throughput of wsup-engine"};
  std::string bin = "build/bin", model, device = "cuda:0", out = ".", batches_s = "1,32", prefill_s;
  std::vector<std::string> engine_args;
  int max_tokens = 128;
  int64_t kv_mib = 4096;
  app.add_option("--bin-dir", bin, "folder of wsup-holder and wsup-engine");
  app.add_option("--model", model, "model folder")->required();
  app.add_option("--device", device, "cpu or cuda:N");
  app.add_option("--out", out, "folder for engine.md, engine.json and the logs");
  app.add_option("--batches", batches_s, "batch sizes, comma-separated");
  app.add_option("--max-tokens", max_tokens, "tokens generated per request");
  app.add_option("--kv-cache-mib", kv_mib, "KV cache of the engine");
  app.add_option("--prefill", prefill_s, "prompt lengths to time prefill at, comma-separated (none by default)");
  app.add_option("--engine-arg", engine_args, "an argument for wsup-engine (repeat for more), e.g. --engine-arg=--matmul");
  CLI11_PARSE(app, argc, argv);
  // Each result as it is measured, also into a file: a run cut short by a
  // time limit still shows how far it got.
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  const std::vector<int> batches = IntList(batches_s), prefills = IntList(prefill_s);
  if (batches.empty()) Die("--batches: give at least one batch size");
  int64_t vocab = 0;
  {
    std::ifstream cf(model + "/config.json");
    json cfg = json::parse(cf, nullptr, false);
    if (cfg.is_discarded() || !cfg.contains("vocab_size")) Die(model + "/config.json: no vocab_size");
    vocab = cfg["vocab_size"].get<int64_t>();
  }
  const bool gpu = device != "cpu";
  // The holder wants its socket in a directory only this user can enter.
  const std::string sock_dir = out + "/sock";
  ::mkdir(sock_dir.c_str(), 0700);
  ::chmod(sock_dir.c_str(), 0700);
  const std::string sock = sock_dir + "/holder.sock";
  ::unlink(sock.c_str());
  std::vector<std::string> holder_argv = {bin + "/wsup-holder", "--model", model, "--socket", sock, "--backend",
                                          gpu ? "cuda" : "host", "--ready-fd", "3"};
  if (gpu) holder_argv.insert(holder_argv.end(), {"--device", device.substr(5)});
  Proc holder = Start(holder_argv, out + "/holder.log", std::chrono::seconds(600));
  std::printf("holder ready in %.0f ms\n", holder.ready_ms);

  const int max_batch = *std::max_element(batches.begin(), batches.end());
  auto engine_argv = [&](const std::string& mode) {
    std::vector<std::string> a = {bin + "/wsup-engine", "--model", model, "--port", "0", "--device", device,
                                  "--weight-cache", mode, "--kv-cache-mib", std::to_string(kv_mib), "--max-batch",
                                  std::to_string(std::max(max_batch, 1)), "--ready-fd", "3"};
    if (mode != "off") a.insert(a.end(), {"--socket", sock});
    a.insert(a.end(), engine_args.begin(), engine_args.end());
    return a;
  };
  Proc e = Start(engine_argv("daemon"), out + "/engine-daemon.log", std::chrono::seconds(600));
  json st_holder = Status(e.port);
  std::printf("engine (holder) ready in %.0f ms\n", e.ready_ms);
  Load(e.port, 1, 8);  // first request: nothing lazily initialized is left in the numbers
  std::vector<Throughput> tp;
  std::vector<double> fwd_ms;  // mean forward time per step during each load
  for (int b : batches) {
    json s0 = Status(e.port);
    tp.push_back(Load(e.port, b, max_tokens));
    json s1 = Status(e.port);
    const double steps = s1["steps"]["total"].get<double>() - s0["steps"]["total"].get<double>();
    fwd_ms.push_back(steps > 0 ? (s1["steps"]["forward_ms_total"].get<double>() - s0["steps"]["forward_ms_total"].get<double>()) / steps : 0);
    std::printf("batch %d: %.1f tokens/s (%.2f ms per step)\n", b, tp.back().tok_s, tp.back().ms_per_step);
  }
  std::vector<Prefill> pf;
  for (int n : prefills) {
    pf.push_back(TimePrefill(e.port, n, vocab));
    std::printf("prefill %d tokens: %.1f ms (%.0f tokens/s)\n", n, pf.back().ms, n / (pf.back().ms / 1000.0));
  }
  json after = Status(e.port);
  Stop(e);

  const bool dropped = DropCaches();
  Proc d = Start(engine_argv("off"), out + "/engine-off.log", std::chrono::seconds(900));
  json st_disk = Status(d.port);
  std::printf("engine (disk) ready in %.0f ms\n", d.ready_ms);
  Stop(d);
  Stop(holder);

  // The table.
  std::ostringstream md;
  md << "| startup phase | weights from the holder (ms) | weights from disk (ms) |\n|---|---:|---:|\n";
  for (const char* ph : {"context", "weights", "communicator", "kv_cache", "graph_capture", "warmup", "listening"}) {
    auto v = [&](const json& s) { return s["phases"].contains(ph) ? s["phases"][ph].get<double>() : 0.0; };
    char row[256];
    std::snprintf(row, sizeof row, "| %s | %.1f | %.1f |\n", ph, v(st_holder), v(st_disk));
    md << row;
  }
  char row[512];
  std::snprintf(row, sizeof row, "| **spawn to ready** (measured outside) | **%.0f** | **%.0f** |\n", e.ready_ms,
                d.ready_ms);
  md << row;
  md << "\nWeights: " << st_holder["weights"]["bytes"].get<uint64_t>() / (1 << 20) << " MiB; holder notes: "
     << st_holder["phase_notes"].value("weights", "") << "; disk notes: " << st_disk["phase_notes"].value("weights", "")
     << (dropped ? " (page cache dropped first)" : " (page cache NOT dropped: not permitted)") << ".\n";
  md << "Graph capture: " << st_holder["phase_notes"].value("graph_capture", "") << ".\n\n";
  md << "| decode, batch | tokens | wall (s) | tokens/s | ms per step | of which the forward pass (ms) |\n"
        "|---:|---:|---:|---:|---:|---:|\n";
  for (size_t i = 0; i < tp.size(); ++i) {
    const auto& t = tp[i];
    std::snprintf(row, sizeof row, "| %d | %llu | %.2f | %.1f | %.2f | %.2f |\n", t.batch,
                  static_cast<unsigned long long>(t.tokens), t.wall_ms / 1000, t.tok_s, t.ms_per_step, fwd_ms[i]);
    md << row;
  }
  if (!pf.empty()) {
    md << "\n| prefill, prompt tokens | time to first token (ms, best of the runs) | runs | prefill tokens/s |\n"
          "|---:|---:|---:|---:|\n";
    for (const auto& p : pf) {
      std::snprintf(row, sizeof row, "| %d | %.1f | %d | %.0f |\n", p.tokens, p.ms, p.runs,
                    p.tokens / (p.ms / 1000.0));
      md << row;
    }
    md << "\nEach prompt length is timed twice, once when the first pass took over " << kOnceMs / 1000 << " s.\n";
  }
  if (after.contains("steps")) {
    md << "\nSteps while measuring: " << after["steps"]["graph"] << " replayed from CUDA graphs, "
       << after["steps"]["eager"] << " eager (prompts).\n";
  }
  std::ofstream(out + "/engine.md") << md.str();
  json prefill_json = json::array();
  for (const auto& p : pf) prefill_json.push_back({{"tokens", p.tokens}, {"ms", p.ms}, {"runs", p.runs}});
  json decode_json = json::array();
  for (const auto& t : tp) decode_json.push_back({{"batch", t.batch}, {"tokens_per_s", t.tok_s}, {"ms_per_step", t.ms_per_step}});
  json raw = {{"holder", st_holder}, {"disk", st_disk}, {"after_load", after}, {"prefill", prefill_json},
              {"decode", decode_json}};
  std::ofstream(out + "/engine.json") << raw.dump(2);
  std::printf("\n%s", md.str().c_str());
  return 0;
}
