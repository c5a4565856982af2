// wsup-bench-upstream: an HTTP upstream that answers at once, on every core,
// for measuring proxies (bench/front.sh UPSTREAM=canned). A real engine
// serves its HTTP on one loop; two proxies in front of it both run at the
// engine's rate and cannot be told apart. This one answers `GET /health` and
// `POST /v1/completions` with bodies the size of wsup-engine's (a one-token
// completion), from one loop per thread, each with its own listening socket
// on the same port (SO_REUSEPORT: the kernel spreads the connections).
//
//   wsup-bench-upstream [--host 127.0.0.1] [--port 0] [--threads 0]
//
// Prints "listening on HOST:PORT" once every loop accepts; runs until
// SIGTERM or SIGINT.
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>
#include <uv.h>

#include <CLI/CLI.hpp>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "common/cpus.h"
#include "http/server.h"

namespace {

using wsup::http::HttpResponse;
using wsup::http::HttpServer;
using wsup::http::ResponseWriter;

constexpr char kHealth[] = R"({"state":"ready","status":"ok"})";
// wsup-engine's answer to a one-token greedy completion, byte for byte but
// for the id and time.
constexpr char kCompletion[] =
    R"({"choices":[{"finish_reason":"length","index":0,"logprobs":null,"text":"\\"}],"created":1796286447,)"
    R"("id":"cmpl-0000000000000001","model":"llama-tiny-f32","object":"text_completion",)"
    R"("usage":{"completion_tokens":1,"prompt_tokens":12,"total_tokens":13}})";

void Handle(const std::shared_ptr<ResponseWriter>& w) {
  const auto& r = w->request();
  if (r.path == "/health" && r.method == "GET") {
    w->Send(HttpResponse::Json(200, kHealth));
  } else if (r.path == "/v1/completions" && r.method == "POST") {
    w->Send(HttpResponse::Json(200, kCompletion));
  } else {
    w->Send(HttpResponse::Json(404, R"({"error":{"message":"the canned upstream serves GET /health and POST )"
                                    R"(/v1/completions"}})"));
  }
}

// A listening socket on host:port with SO_REUSEPORT; -errno on failure.
int ReusePortSocket(const std::string& host, int port, int* bound_port) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -errno;
  int one = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  if (setsockopt(fd, SOL_SOCKET, SO_REUSEPORT, &one, sizeof one) != 0) {
    int e = errno;
    close(fd);
    return -e;
  }
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  if (uv_inet_pton(AF_INET, host.c_str(), &a.sin_addr) != 0 ||
      bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 || listen(fd, 1024) != 0) {
    int e = errno ? errno : EINVAL;
    close(fd);
    return -e;
  }
  socklen_t len = sizeof a;
  getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  *bound_port = ntohs(a.sin_port);
  return fd;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"wsup-bench-upstream: a canned HTTP upstream on every core, for proxy benchmarks"};
  std::string host = "127.0.0.1";
  int port = 0;
  int threads = 0;
  app.add_option("--host", host, "IPv4 address to listen on");
  app.add_option("--port", port, "port; 0 picks a free one")->check(CLI::Range(0, 65535));
  app.add_option("--threads", threads, "loops (threads); 0: one per CPU")->check(CLI::Range(0, 256));
  CLI11_PARSE(app, argc, argv);
  if (threads == 0) threads = wsup::UsableCpus();

  // Every socket is bound before any loop runs, so a connection never
  // reaches a port that only some loops serve.
  std::vector<int> fds;
  for (int i = 0; i < threads; ++i) {
    int bound = 0;
    int fd = ReusePortSocket(host, port, &bound);
    if (fd < 0) {
      std::fprintf(stderr, "wsup-bench-upstream: listening on %s:%d: %s; pick another --port or --host\n",
                   host.c_str(), port, std::strerror(-fd));
      return 1;
    }
    port = bound;  // the others join the first one's port
    fds.push_back(fd);
  }

  // SIGTERM and SIGINT end the process; the loops need no orderly close.
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);

  std::atomic<int> failed{0};
  std::vector<std::thread> loops;
  for (int fd : fds) {
    loops.emplace_back([fd, &failed] {
      uv_loop_t loop;
      uv_loop_init(&loop);
      wsup::http::ServerOptions o;
      o.max_connections = 65536;
      o.server_name = "wsup-bench-upstream";
      HttpServer server(&loop, o, Handle);
      wsup::Status st = server.Adopt(fd);
      if (!st.ok()) {
        std::fprintf(stderr, "wsup-bench-upstream: %s\n", st.ToString().c_str());
        failed = 1;
        return;
      }
      uv_run(&loop, UV_RUN_DEFAULT);
    });
  }
  std::printf("listening on %s:%d (%d loops)\n", host.c_str(), port, threads);
  std::fflush(stdout);
  int sig = 0;
  sigwait(&set, &sig);
  std::_Exit(failed ? 1 : 0);
}
