#include "testkit/browser.h"

#include <unistd.h>

#include <chrono>
#include <sstream>

#include "testkit/test_util.h"

namespace wsup::test {

bool HaveChromium() { return ::access(kChromium, X_OK) == 0; }

std::string RenderedPage::Console() const {
  std::string out;
  for (const auto& line : console) out += line + "\n";
  return out;
}

size_t RenderedPage::Count(const std::string& needle) const {
  size_t n = 0;
  for (size_t at = dom.find(needle); at != std::string::npos; at = dom.find(needle, at + needle.size())) ++n;
  return n;
}

std::string ReportPageProblems(const RenderedPage& page, size_t failovers) {
  std::string p;
  if (!page.ran) p += "chromium failed: " + page.output + "\n";
  if (!page.console.empty()) p += "its console said:\n" + page.Console();
  const std::string n = std::to_string(failovers);
  if (page.dom.find("data-rendered=\"" + n + "\"") == std::string::npos)
    p += "the page's script did not finish with " + n + " bars (no data-rendered=\"" + n + "\" on <body>)\n";
  if (page.Count("class=\"failover-bar\"") != failovers)
    p += std::to_string(page.Count("class=\"failover-bar\"")) + " failover bars, not " + n + "\n";
  return p;
}

RenderedPage RenderPage(const std::string& html_path, const std::string& work_dir,
                        const std::string& screenshot_path) {
  RenderedPage page;
  // No sandbox (tests may run as root, where Chromium's refuses to start),
  // no GPU, /tmp instead of /dev/shm (small in containers); the virtual time
  // budget lets the page's timers run before the DOM is taken.
  const std::vector<std::string> common = {kChromium,
                                           "--headless",
                                           "--no-sandbox",
                                           "--disable-gpu",
                                           "--disable-dev-shm-usage",
                                           "--no-first-run",
                                           "--user-data-dir=" + work_dir + "/chromium-profile",
                                           "--virtual-time-budget=3000"};
  std::vector<std::string> dump = common;
  dump.insert(dump.end(), {"--enable-logging=stderr", "--v=0", "--dump-dom", "file://" + html_path});
  RunResult r = Run(dump, std::chrono::seconds(90));
  page.output = r.output;
  page.ran = r.exit_code == 0;
  // The DOM is the output from its doctype on; chromium's log lines (which
  // start with '[') come before and around it.
  std::istringstream in(r.output);
  std::string line;
  bool in_dom = false;
  while (std::getline(in, line)) {
    if (line.find(":CONSOLE") != std::string::npos && line.rfind('[', 0) == 0) {
      page.console.push_back(line);
      continue;
    }
    if (!in_dom && (line.rfind("<!DOCTYPE", 0) == 0 || line.rfind("<html", 0) == 0)) in_dom = true;
    if (in_dom && line.rfind('[', 0) != 0) page.dom += line + "\n";
  }
  if (!screenshot_path.empty()) {
    std::vector<std::string> shot = common;
    shot.insert(shot.end(), {"--window-size=1280,1400", "--hide-scrollbars", "--screenshot=" + screenshot_path,
                             "file://" + html_path});
    RunResult s = Run(shot, std::chrono::seconds(90));
    page.ran = page.ran && s.exit_code == 0;
    if (s.exit_code != 0) page.output += s.output;
  }
  return page;
}

}  // namespace wsup::test
