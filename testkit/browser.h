// A page rendered in headless Chromium (Debian's `chromium`), for tests of
// the HTML that wsup writes (`wsup report --html`): the DOM after the page's
// scripts ran, every message its console printed (an uncaught error is
// one), and a screenshot.
#pragma once

#include <string>
#include <vector>

namespace wsup::test {

inline constexpr const char* kChromium = "/usr/bin/chromium";

// Whether kChromium can be run.
bool HaveChromium();

struct RenderedPage {
  bool ran = false;                   // chromium exited 0 both times
  std::string dom;                    // the document after its scripts (--dump-dom)
  std::vector<std::string> console;   // its console's messages, as chromium logged them
  std::string output;                 // chromium's own words, for a failure's message

  // The console's messages, a line each (for a failure's message).
  std::string Console() const;
  // How many times `needle` occurs in the DOM.
  size_t Count(const std::string& needle) const;
};

// What is wrong with a rendered `wsup report --html` page that should show
// `failovers` bars ("" when nothing is): chromium failed, its console said
// something, the page's script did not finish (body's data-rendered), or
// the bars are not one per failover.
std::string ReportPageProblems(const RenderedPage& page, size_t failovers);

// Loads `html_path` (a file) twice with a fresh profile under `work_dir`:
// once for its DOM and console, once for a screenshot written to
// `screenshot_path` (a PNG; empty: none). Each run is bounded.
RenderedPage RenderPage(const std::string& html_path, const std::string& work_dir,
                        const std::string& screenshot_path);

}  // namespace wsup::test
