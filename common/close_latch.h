// CloseLatch: the end of an owner's asynchronous close.
//
// An owner of libuv handles, connections or threads closes in two halves:
// Close(done) starts closing its parts, and each part reports back from its
// own callback as it goes. `done` must run once, after the last part, from
// whichever report comes last, and Close may be called again meanwhile (a
// signal during a drain). Five owners (the HTTP server, the front and its
// acceptor, proxy and upstream pool) had the same few lines for that, each
// with the same care: `done` is moved out before it runs, because it may
// destroy the owner.
//
//   CloseLatch close_{[this] { return open_handles_ == 0; }};
//   void Close(std::function<void()> done) {
//     if (!close_.Begin(std::move(done))) return;  // closing already
//     ... start closing the parts; each one's callback calls close_.Check()
//     close_.Check();
//   }
//
// Threads: the owner's.
#pragma once

#include <functional>
#include <utility>

namespace wsup {

class CloseLatch {
 public:
  // `all_closed` says whether every part has finished closing.
  explicit CloseLatch(std::function<bool()> all_closed) : all_closed_(std::move(all_closed)) {}
  CloseLatch(const CloseLatch&) = delete;
  CloseLatch& operator=(const CloseLatch&) = delete;

  // Keeps `done` (a newer one replaces a waiting one; an empty one keeps
  // it). True the first time only: the caller then starts closing. A later
  // call checks at once whether all has closed already.
  bool Begin(std::function<void()> done) {
    if (done) done_ = std::move(done);
    if (closing_) {
      Check();
      return false;
    }
    closing_ = true;
    return true;
  }

  bool closing() const { return closing_; }

  // A part has closed: runs the waiting `done` if the close has begun and
  // every part is closed. Safe to call at any time.
  void Check() {
    if (!done_ || !all_closed_()) return;
    std::function<void()> done = std::move(done_);
    done_ = nullptr;
    done();
  }

 private:
  std::function<bool()> all_closed_;
  std::function<void()> done_;
  bool closing_ = false;
};

}  // namespace wsup
