#include "testkit/engine_process.h"

#include <fcntl.h>
#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>

namespace wsup::test {

std::optional<std::string> ReadLine(int fd, std::chrono::milliseconds limit) {
  auto deadline = std::chrono::steady_clock::now() + limit;
  std::string line;
  for (;;) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) return std::nullopt;
    pollfd p{fd, POLLIN, 0};
    int r = ::poll(&p, 1, static_cast<int>(left.count()));
    if (r < 0 && errno == EINTR) continue;
    if (r != 1) return std::nullopt;
    char c;
    ssize_t n = ::read(fd, &c, 1);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return std::nullopt;
    if (c == '\n') return line;
    line.push_back(c);
  }
}

ReadyProcess StartWithReadyFd(const std::vector<std::string>& argv, const std::string& log,
                              std::chrono::milliseconds limit) {
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) std::abort();  // out of fds: nothing a test can go on with
  ReadyProcess p;
  p.log = log;
  p.child = Child::Start(argv, log, {fds[1]});
  ::close(fds[1]);
  auto line = ReadLine(fds[0], limit);
  ::close(fds[0]);
  if (line) {
    p.ready = true;
    p.ready_line = *line;
    auto colon = line->rfind(':');
    if (line->rfind("listening on ", 0) == 0 && colon != std::string::npos) p.port = std::atoi(line->c_str() + colon + 1);
  }
  return p;
}

ReadyProcess StartEngine(const TempDir& dir, const std::string& model, std::vector<std::string> extra,
                         const std::string& log_name, std::chrono::milliseconds limit) {
  std::vector<std::string> argv = {BinPath("wsup-engine"), "--model", TestData(model), "--port", "0",
                                   "--ready-fd", "3", "--log-level", "warn"};
  // A small cache keeps startup fast; a test may ask for another size.
  if (std::find(extra.begin(), extra.end(), "--kv-cache-mib") == extra.end()) {
    argv.insert(argv.end(), {"--kv-cache-mib", "4"});
  }
  argv.insert(argv.end(), extra.begin(), extra.end());
  return StartWithReadyFd(argv, dir.Join(log_name), limit);
}

ReadyProcess StartHolder(const TempDir& dir, const std::string& model_dir, const std::string& socket,
                         std::vector<std::string> extra, const std::string& log_name) {
  std::vector<std::string> argv = {BinPath("wsup-holder"), "--model", model_dir, "--socket", socket,
                                   "--backend", "host", "--ready-fd", "3", "--log-level", "warn"};
  argv.insert(argv.end(), extra.begin(), extra.end());
  return StartWithReadyFd(argv, dir.Join(log_name));
}

}  // namespace wsup::test
