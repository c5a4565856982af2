#include "engine/scheduler.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cmath>

namespace wsup::engine {

Scheduler::Scheduler(ModelRunner* runner, SchedulerOptions opts, Sink sink, const EngineClock& clock)
    : runner_(runner), opts_(opts), sink_(std::move(sink)), clock_(clock),
      blocks_(runner->kv_layout()),
      budget_(std::max(1, opts.max_step_tokens), std::max<int64_t>(0, opts.max_step_ms) * 1000),
      // The cache's layout is fixed before the scheduler exists: so is the journal's size.
      journal_(PoolJournalGeometry(runner->kv_layout(), runner->dims().max_pos, opts.max_batch, opts.kv_format),
               PoolBytes{[runner](uint64_t off, void* out, size_t n) { return runner->ReadKvPool(off, out, n); },
                         [runner](uint64_t off, const void* in, size_t n) { return runner->WriteKvPool(off, in, n); }},
               clock, opts.adopt_keep_ms) {
  opts_.max_batch = std::max(1, opts_.max_batch);
  opts_.max_step_tokens = std::max(1, opts_.max_step_tokens);
  opts_.keepalive_ms = std::max<int64_t>(1, opts_.keepalive_ms);
  stats_.total_blocks = runner_->kv_layout().scratch_blocks;
  stats_.free_blocks = stats_.total_blocks;
  stats_.prefill_budget = budget_.PrefillTokens();
  // The runner's communicator was proven at startup.
  stats_.last_keepalive_mono_ms = clock_.NowMs();
  next_keepalive_ms_ = stats_.last_keepalive_mono_ms + opts_.keepalive_ms;
}

Scheduler::~Scheduler() { Stop(); }

void Scheduler::Start() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    stats_.running = true;
  }
  thread_ = std::thread([this] { Loop(); });
}

void Scheduler::Stop() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
  if (map_thread_.joinable()) map_thread_.join();
  std::lock_guard<std::mutex> lk(mu_);
  stats_.running = false;
}

int Scheduler::BlocksFor(int64_t tokens) const {
  const int bs = runner_->block_size();
  return static_cast<int>((tokens + bs - 1) / bs);
}

int64_t Scheduler::max_sequence_tokens() const {
  const KvLayout& kv = runner_->kv_layout();
  return std::min<int64_t>(runner_->dims().max_pos,
                           (static_cast<int64_t>(kv.pool_blocks) - JournalBlocks() + kv.scratch_blocks) *
                               runner_->block_size());
}

bool Scheduler::HoldsForPool() const {
  // Only an engine that may yet get the pool, and not one letting it go.
  return opts_.adopt_wait_ms > 0 && runner_->kv_layout().pooled() && pool_ == PoolState::kClosed;
}

void Scheduler::TryAdopt(Seq& s) {
  s.adopt_tried = true;
  PoolAdoption a =
      journal_.Adopt(runner_->kv_layout().pooled(), pool_ == PoolState::kOpen, s.req.request_id, s.req.prompt);
  for (uint32_t b : a.released) blocks_.Release(b);
  if (!a.adopted) return;
  blocks_.Adopt(a.pages, &s.blocks);
  s.prefilled = a.count;
  // The journal goes on describing it from what it adopted.
  journal_.HashTokens(s.req.prompt, s.generated, a.count, &s.hash);
}

void Scheduler::ExpireHeld(int64_t now) {
  // Held in arrival order with one bound each: the expired are in front.
  while (!held_.empty() && held_.front().held_until_ms <= now) {
    Seq s = std::move(held_.front());
    held_.pop_front();
    held_max_ms_ = std::max(held_max_ms_, now - s.held_since_ms);
    waiting_.push_back(std::move(s));
  }
}

void Scheduler::ReleaseUnclaimed(const char* why) {
  // Dropped while closing: handed out no more.
  for (uint32_t b : journal_.Release(why)) blocks_.Release(b);
}

Status Scheduler::Submit(GenRequest req) {
  const int64_t need = static_cast<int64_t>(req.prompt.size()) + req.max_tokens;
  if (req.prompt.empty()) return InvalidArgument("the prompt is empty; send at least one token");
  if (need > runner_->dims().max_pos) {
    return InvalidArgument("prompt (" + std::to_string(req.prompt.size()) + " tokens) plus max_tokens (" +
                           std::to_string(req.max_tokens) + ") exceeds the model's context of " +
                           std::to_string(runner_->dims().max_pos) + " tokens; shorten the prompt or lower max_tokens");
  }
  const KvLayout& kv = runner_->kv_layout();
  // The pool's journal blocks are never handed out: a request that needed
  // them would wait for ever.
  const int64_t kv_tokens =
      (static_cast<int64_t>(kv.pool_blocks) - JournalBlocks() + kv.scratch_blocks) * runner_->block_size();
  if (need > kv_tokens) {
    return InvalidArgument("prompt plus max_tokens needs " + std::to_string(need) + " positions of KV cache but the "
                           "engine's whole cache holds " + std::to_string(kv_tokens) +
                           (kv.pooled() ? "; lower max_tokens, or give the node a larger KV pool ([kv] pool_mib)"
                                        : "; lower max_tokens, or restart the engine with a larger --kv-cache-mib"));
  }
  std::lock_guard<std::mutex> lk(mu_);
  if (!stats_.comm_ok) {
    return Unavailable("the engine's communicator failed (" + stats_.comm_error + "); restart the engine");
  }
  if (stop_) return Unavailable("the engine is shutting down; retry on another engine");
  if (stats_.waiting + static_cast<int>(incoming_.size()) >= opts_.max_waiting) {
    return Unavailable("the engine has " + std::to_string(opts_.max_waiting) +
                       " requests waiting for KV cache; retry later");
  }
  req.submitted_us = clock_.NowUs();
  stats_.prompt_tokens += req.prompt.size();
  incoming_.push_back(std::move(req));
  cv_.notify_all();
  return Status::Ok();
}

void Scheduler::OpenPool(PoolFetch fetch, PoolDone done) {
  std::unique_lock<std::mutex> lk(mu_);
  // Role requests take effect in the order they came, so only an open with
  // nothing queued before it is started from here.
  if (pool_cmds_.empty() && map_phase_ == MapPhase::kMapping) {
    map_waiters_.push_back(std::move(done));
    return;
  }
  // Not mapped (and not being unmapped: stats_ says mapped until the
  // unmap is done), by a pooled runner: map it now, beside the step.
  if (pool_cmds_.empty() && runner_->kv_layout().pooled() && map_phase_ == MapPhase::kIdle && !stats_.pool_mapped) {
    StartMapping(lk, std::move(fetch), std::move(done));
    return;
  }
  // Mapped already, closing, a private cache, or behind another request:
  // the scheduler thread takes it in turn.
  pool_cmds_.push_back(PoolCommand{true, std::move(fetch), std::move(done)});
  cv_.notify_all();
}

void Scheduler::StartMapping(std::unique_lock<std::mutex>& lk, PoolFetch fetch, PoolDone done) {
  map_phase_ = MapPhase::kMapping;
  map_waiters_.push_back(std::move(done));
  // The last mapping thread is done with the pool (the phase was idle);
  // it may still be telling its waiters.
  std::thread previous = std::move(map_thread_);
  lk.unlock();
  if (previous.joinable()) previous.join();
  lk.lock();
  map_thread_ = std::thread([this, fetch = std::move(fetch)] { MapPool(fetch); });
}

void Scheduler::MapPool(const PoolFetch& fetch) {
  auto fds = fetch();
  Status st = fds.ok() ? runner_->MapKvPool(*fds) : Status(fds.error());
  std::vector<PoolDone> waiters;
  {
    std::lock_guard<std::mutex> lk(mu_);
    map_phase_ = st.ok() ? MapPhase::kMapped : MapPhase::kIdle;
    // Said mapped before anyone is told (PoolStatsLocked on the scheduler
    // thread agrees: the runner says so too).
    stats_.pool_mapped = runner_->kv_pool_mapped();
    waiters.swap(map_waiters_);
  }
  cv_.notify_all();
  for (auto& w : waiters) w(st);
}

void Scheduler::HandOutPool() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (map_phase_ != MapPhase::kMapped) return;
    map_phase_ = MapPhase::kIdle;
  }
  pool_ = PoolState::kOpen;
  // The previous engine's journal is read before any block is handed out:
  // its sequences' pages are kept for their resumes, and the journal's
  // own blocks are never handed out.
  journal_.Open();
  blocks_.OpenPool(KeptPoolBlocks());
  // The resumes that waited for the pool go first, in their order.
  const int64_t now = clock_.NowMs();
  while (!held_.empty()) {
    held_max_ms_ = std::max(held_max_ms_, now - held_.back().held_since_ms);
    waiting_.push_front(std::move(held_.back()));
    held_.pop_back();
  }
}

void Scheduler::ClosePool(PoolDone done) {
  std::lock_guard<std::mutex> lk(mu_);
  pool_cmds_.push_back(PoolCommand{false, nullptr, std::move(done)});
  cv_.notify_all();
}

void Scheduler::Cancel(uint64_t id) {
  std::lock_guard<std::mutex> lk(mu_);
  cancels_.insert(id);
  cv_.notify_all();
}

SchedulerStats Scheduler::stats() const {
  std::lock_guard<std::mutex> lk(mu_);
  SchedulerStats s = stats_;
  s.waiting += static_cast<int>(incoming_.size());
  return s;
}

void Scheduler::Loop() {
  for (;;) {
    std::unordered_set<uint64_t> cancels;
    {
      std::unique_lock<std::mutex> lk(mu_);
      for (;;) {
        if (stop_) return;
        // Pool commands wait for a mapping in flight (its end wakes us).
        const bool pool_work = (!pool_cmds_.empty() && map_phase_ == MapPhase::kIdle) ||
                               map_phase_ == MapPhase::kMapped;
        if (!active_.empty() || !waiting_.empty() || !incoming_.empty() || !cancels_.empty() || pool_work) {
          break;
        }
        // Timed work: the keepalive, a held resume's bound, the previous
        // journal's pages' bound.
        const int64_t now = clock_.NowMs();
        int64_t wake = next_keepalive_ms_;
        if (!held_.empty()) wake = std::min(wake, held_.front().held_until_ms);
        if (journal_.keeping()) wake = std::min(wake, journal_.keep_until_ms());
        if (now >= wake) break;
        clock_.WaitUntilMs(cv_, lk, wake);
      }
      const int64_t now = clock_.NowMs();
      while (!incoming_.empty()) {
        Seq s;
        s.req = std::move(incoming_.front());
        incoming_.pop_front();
        s.rng.seed(s.req.seed);
        if (s.req.resumed && HoldsForPool()) {
          s.held_since_ms = now;
          s.held_until_ms = now + opts_.adopt_wait_ms;
          ++held_total_;
          held_.push_back(std::move(s));
        } else if (s.req.probe) {
          ++stats_.probes;
          // Behind the probes already waiting, ahead of everything else.
          auto at = std::find_if(waiting_.begin(), waiting_.end(), [](const Seq& w) { return !w.req.probe; });
          waiting_.insert(at, std::move(s));
        } else {
          waiting_.push_back(std::move(s));
        }
      }
      // stats() counts incoming_ as waiting: what just moved out of it must
      // be counted in the same critical section, or a reader between here
      // and the end of the step sees the requests nowhere (active 0,
      // waiting 0) and takes the engine for idle.
      stats_.waiting = static_cast<int>(waiting_.size() + held_.size());
      stats_.resume_held = static_cast<int>(held_.size());
      cancels.swap(cancels_);
    }
    if (!cancels.empty()) {
      // A cancel for a request that already finished finds nothing and counts nothing.
      cancelled_ += std::erase_if(held_, [&](const Seq& s) { return cancels.count(s.req.id) > 0; });
      for (auto& s : waiting_) {
        if (cancels.count(s.req.id)) {
          blocks_.Free(&s.blocks);  // adopted pages, if it had its turn but no room yet
          s.req.id = 0;
          ++cancelled_;
        }
      }
      std::erase_if(waiting_, [](const Seq& s) { return s.req.id == 0; });
      for (auto& s : active_) {
        if (cancels.count(s.req.id)) {
          journal_.Remove(s.req.request_id, s.hash);
          blocks_.Free(&s.blocks);
          s.req.id = 0;  // marks it for removal
          ++cancelled_;
        }
      }
      std::erase_if(active_, [](const Seq& s) { return s.req.id == 0; });
      journal_.Flush();
    }
    if (clock_.NowMs() >= next_keepalive_ms_) RunKeepalive();
    // Pool work runs between steps, so it delays every sequence's next
    // token: the debug log says when it took long enough to see.
    const int64_t pool_work_start = clock_.NowUs();
    HandOutPool();
    RunPoolCommands();
    const int64_t pool_work_us = clock_.NowUs() - pool_work_start;
    if (pool_work_us >= 1000) {
      spdlog::debug("KV pool work between steps took {:.1f} ms ({} sequences waiting for their next token)",
                    static_cast<double>(pool_work_us) / 1e3, active_.size());
    }
    ExpireHeld(clock_.NowMs());
    if (journal_.keeping() && clock_.NowMs() >= journal_.keep_until_ms())
      ReleaseUnclaimed("nobody resumed them in time");
    Admit();
    if (!active_.empty()) {
      const int64_t step_start = clock_.NowMs();
      StepOnce();
      if (opts_.min_step_ms > 0) {
        std::unique_lock<std::mutex> lk(mu_);
        const int64_t step_end = step_start + opts_.min_step_ms;
        while (!stop_ && clock_.NowMs() < step_end) clock_.WaitUntilMs(cv_, lk, step_end);
      }
    }
    MaybeFinishClose();
    std::lock_guard<std::mutex> lk(mu_);
    stats_.active = static_cast<int>(active_.size());
    stats_.waiting = static_cast<int>(waiting_.size() + held_.size());
    PoolStatsLocked();
    stats_.finished = finished_;
    stats_.cancelled = cancelled_;
  }
}

void Scheduler::RunKeepalive() {
  const int64_t t0 = clock_.NowUs();
  Status st = runner_->Keepalive();
  const int64_t t1 = clock_.NowUs();
  next_keepalive_ms_ = t1 / 1000 + opts_.keepalive_ms;
  std::lock_guard<std::mutex> lk(mu_);
  ++stats_.keepalives;
  if (st.ok()) {
    stats_.last_keepalive_mono_ms = t1 / 1000;
    stats_.last_keepalive_us = t1 - t0;
  } else {
    ++stats_.keepalive_failures;
    if (stats_.comm_ok) spdlog::error("communicator keepalive failed: {}", st.ToString());
    stats_.comm_ok = false;
    stats_.comm_error = st.error().message();
  }
}

void Scheduler::Admit() {
  while (!waiting_.empty() && static_cast<int>(active_.size()) < opts_.max_batch) {
    Seq& s = waiting_.front();
    if (s.req.resumed && !s.adopt_tried) TryAdopt(s);
    // Beyond the pages it adopted, if any.
    const int need = BlocksFor(static_cast<int64_t>(s.req.prompt.size()) + s.req.max_tokens) -
                     static_cast<int>(s.blocks.size());
    // The pool's blocks first: the scratch stays free for the probes and
    // the first requests after a promotion.
    if (!blocks_.Take(need, &s.blocks).ok()) {
      // Pages kept for resumes that have not come yet give way to a
      // request that is here.
      if (journal_.keeping()) {
        ReleaseUnclaimed("a waiting request needs the blocks");
        continue;
      }
      break;  // first come, first served
    }
    active_.push_back(std::move(s));
    waiting_.pop_front();
  }
}

void Scheduler::PoolStatsLocked() {
  const KvLayout& kv = runner_->kv_layout();
  stats_.free_blocks = blocks_.free_count();
  stats_.total_blocks = kv.scratch_blocks + (pool_ == PoolState::kOpen ? kv.pool_blocks - JournalBlocks() : 0);
  stats_.journal = journal_.on();
  stats_.journal_blocks = journal_.on() ? JournalBlocks() : 0;
  stats_.journal_entries = journal_.entries();
  stats_.journal_found = journal_.found();
  stats_.journal_writes = journal_.writes();
  stats_.journal_errors = journal_.errors();
  stats_.adopted_sequences = journal_.adopted_sequences();
  stats_.adopted_tokens = journal_.adopted_tokens();
  stats_.adopted_by_page = journal_.adopted_by_page();
  stats_.recomputed_sequences = journal_.recomputed();
  stats_.recomputed_reasons = journal_.recomputed_reasons();
  stats_.resume_held = static_cast<int>(held_.size());
  stats_.resume_held_total = held_total_;
  stats_.resume_held_max_ms = held_max_ms_;
  stats_.adoptable_blocks = journal_.pages_kept();
  stats_.released_blocks = journal_.released_blocks();
  stats_.pool_mapped = runner_->kv_pool_mapped();
  stats_.pool_closing = pool_ == PoolState::kClosing;
  stats_.pool_blocks_in_use = blocks_.pool_in_use();
}

void Scheduler::Done(const PoolDone& done, const Status& st) {
  // What the caller reads in stats() once told must already be true.
  {
    std::lock_guard<std::mutex> lk(mu_);
    PoolStatsLocked();
  }
  done(st);
}

void Scheduler::RunPoolCommands() {
  std::deque<PoolCommand> cmds;
  {
    std::lock_guard<std::mutex> lk(mu_);
    // A mapping still running finishes first: what comes after it waits
    // (a close must not unmap what is being mapped).
    if (map_phase_ != MapPhase::kIdle) return;
    cmds.swap(pool_cmds_);
  }
  const KvLayout& kv = runner_->kv_layout();
  while (!cmds.empty()) {
    PoolCommand c = std::move(cmds.front());
    cmds.pop_front();
    if (!kv.pooled()) {
      Done(c.done, Refused("this engine keeps a private KV cache (started without --kv-pool)"));
      continue;
    }
    if (!c.open) {
      if (pool_ == PoolState::kOpen) {
        pool_ = PoolState::kClosing;
        blocks_.ClosePool();  // handed out no more; the held ones are dropped as they come back
        // Nothing adopts from a pool this engine lets go: kept pages are
        // dropped, and a waiting request's adopted pages given back (it is
        // computed in full when its turn comes).
        ReleaseUnclaimed("the pool is being let go");
        journal_.DropPrevious();
        for (auto& w : waiting_) {
          if (w.blocks.empty()) continue;
          blocks_.Free(&w.blocks);
          w.prefilled = 0;
          w.hash = JournalHash{};
        }
      }
      if (pool_ == PoolState::kClosed) {
        Done(c.done, Status::Ok());
      } else {
        close_waiters_.push_back(std::move(c.done));
      }
      continue;
    }
    if (pool_ == PoolState::kOpen) {
      Done(c.done, Status::Ok());
      continue;
    }
    if (pool_ == PoolState::kClosing) {
      // Still mapped: keep it, and hand out again the blocks nobody holds
      // (never the journal's).
      std::vector<bool> held = KeptPoolBlocks();
      for (const auto& s : active_) {
        for (int32_t b : s.blocks) {
          if (b < kv.pool_blocks) held[static_cast<size_t>(b)] = true;
        }
      }
      blocks_.OpenPool(held);
      pool_ = PoolState::kOpen;
      for (auto& w : close_waiters_) Done(w, Refused("the pool was opened again before its blocks came back"));
      close_waiters_.clear();
      Done(c.done, Status::Ok());
      continue;
    }
    // Closed: mapped off this thread, as OpenPool does; the commands after
    // it wait for the mapping, in their order.
    std::unique_lock<std::mutex> lk(mu_);
    while (!cmds.empty()) {
      pool_cmds_.push_front(std::move(cmds.back()));
      cmds.pop_back();
    }
    StartMapping(lk, std::move(c.fetch), std::move(c.done));
    return;
  }
}

void Scheduler::MaybeFinishClose() {
  // Without a waiter nothing is retried: a pool that could not be unmapped
  // stays closing (mapped, handed out no more) until the next ClosePool().
  if (pool_ != PoolState::kClosing || blocks_.pool_in_use() > 0 || close_waiters_.empty()) return;
  // No sequence holds a pool block: the journal describes none (each was
  // freed as it ended) and goes with the pool.
  journal_.Close();
  Status st = runner_->UnmapKvPool();
  if (st.ok()) {
    pool_ = PoolState::kClosed;
  } else {
    spdlog::error("KV pool: {}", st.ToString());
  }
  std::vector<PoolDone> waiters;
  waiters.swap(close_waiters_);
  for (auto& w : waiters) Done(w, st);
}

void Scheduler::Finish(Seq& s, std::vector<GenEvent>* events, std::string reason, std::optional<Error> error) {
  if (spdlog::should_log(spdlog::level::debug) && s.first_token_us > 0) {
    spdlog::debug("request {} ({}): {} prompt and {} generated tokens; first token {:.1f} ms after it came, "
                  "done at {:.1f} ms; longest wait between two tokens {:.1f} ms",
                  s.req.id, reason, s.req.prompt.size(), s.generated.size(),
                  static_cast<double>(s.first_token_us - s.req.submitted_us) / 1e3,
                  static_cast<double>(s.last_token_us - s.req.submitted_us) / 1e3,
                  static_cast<double>(s.longest_gap_us) / 1e3);
  }
  GenEvent& e = events->back();
  e.done = true;
  e.finish_reason = std::move(reason);
  e.error = std::move(error);
  blocks_.Free(&s.blocks);
  s.req.id = 0;
  ++finished_;
}

int32_t Scheduler::Sample(Seq& s, const float* logits) {
  const int64_t vocab = runner_->dims().vocab;
  int64_t best = 0;
  for (int64_t i = 1; i < vocab; ++i) {
    if (logits[i] > logits[best]) best = i;
  }
  if (s.req.temperature <= 0) return static_cast<int32_t>(best);
  // Softmax at the temperature, in double; one uniform draw from the
  // request's own generator, so a seed reproduces the same text.
  thread_local std::vector<double> p;
  p.resize(static_cast<size_t>(vocab));
  double sum = 0;
  for (int64_t i = 0; i < vocab; ++i) {
    double v = std::exp((static_cast<double>(logits[i]) - logits[best]) / s.req.temperature);
    if (!std::isfinite(v)) v = 0;
    p[static_cast<size_t>(i)] = v;
    sum += v;
  }
  const double u = static_cast<double>(s.rng() >> 11) * 0x1.0p-53 * sum;
  double acc = 0;
  for (int64_t i = 0; i < vocab; ++i) {
    acc += p[static_cast<size_t>(i)];
    if (u < acc) return static_cast<int32_t>(i);
  }
  return static_cast<int32_t>(best);
}

void Scheduler::StepOnce() {
  StepBatch b;
  std::vector<size_t> row_seq;
  // The prefill budget (engine/step_budget.h): the probes' prompts first,
  // then the others' in the order they were admitted. While a probe runs,
  // the others get at most StepBudget::kMinChunk tokens a step: its
  // answer takes max_tokens steps, and steps full of other prompts would
  // make its latency measure their length, not the engine's health (a
  // probe is short and comes every interval_ms, so the prompts lose little).
  // Running streams' next tokens go in whatever the budget.
  std::vector<size_t> chunk(active_.size(), 0);
  int budget = budget_.PrefillTokens();
  int prefill = 0;
  const bool probing = std::any_of(active_.begin(), active_.end(), [](const Seq& s) { return s.req.probe; });
  for (const bool probes : {true, false}) {
    if (!probes && probing) budget = std::min(budget, StepBudget::kMinChunk);
    for (size_t i = 0; i < active_.size() && budget > 0; ++i) {
      const Seq& s = active_[i];
      if (s.req.probe != probes || s.prefilled >= s.req.prompt.size()) continue;
      chunk[i] = std::min(s.req.prompt.size() - s.prefilled, static_cast<size_t>(budget));
      budget -= static_cast<int>(chunk[i]);
      prefill += static_cast<int>(chunk[i]);
    }
  }
  for (size_t i = 0; i < active_.size(); ++i) {
    Seq& s = active_[i];
    b.block_tables.push_back(&s.blocks);
    const int32_t si = static_cast<int32_t>(i);
    const size_t plen = s.req.prompt.size();
    if (s.prefilled < plen) {
      const size_t k = chunk[i];
      if (k == 0) continue;
      for (size_t j = 0; j < k; ++j) {
        b.tokens.push_back(s.req.prompt[s.prefilled + j]);
        b.positions.push_back(static_cast<int32_t>(s.prefilled + j));
        b.seq.push_back(si);
      }
      s.prefilled += k;
      if (s.prefilled < plen) continue;  // the rest of the prompt next step
    } else {
      b.tokens.push_back(s.generated.back());
      b.positions.push_back(static_cast<int32_t>(plen + s.generated.size() - 1));
      b.seq.push_back(si);
    }
    b.logit_rows.push_back(static_cast<int32_t>(b.tokens.size() - 1));
    row_seq.push_back(i);
  }
  if (b.tokens.empty()) return;

  std::vector<GenEvent> events;
  const int64_t step_start_us = clock_.NowUs();
  Status st = runner_->Step(b, &logits_);
  budget_.Observe(prefill, clock_.NowUs() - step_start_us);
  if (!st.ok()) {
    spdlog::error("forward step failed: {}", st.ToString());
    {
      std::lock_guard<std::mutex> lk(mu_);
      stats_.comm_ok = false;
      stats_.comm_error = st.error().message();
    }
    for (auto& s : active_) {
      events.push_back(GenEvent{s.req.id});
      journal_.Remove(s.req.request_id, s.hash);
      Finish(s, &events, "error", st.error());
    }
    active_.clear();
    journal_.Flush();
    sink_(std::move(events));
    return;
  }
  const int64_t vocab = runner_->dims().vocab;
  uint64_t produced = 0;
  const int64_t now_us = clock_.NowUs();
  for (size_t r = 0; r < row_seq.size(); ++r) {
    Seq& s = active_[row_seq[r]];
    const int32_t tok = Sample(s, logits_.data() + static_cast<int64_t>(r) * vocab);
    s.generated.push_back(tok);
    if (s.first_token_us == 0) {
      s.first_token_us = now_us;
    } else {
      s.longest_gap_us = std::max(s.longest_gap_us, now_us - s.last_token_us);
    }
    s.last_token_us = now_us;
    ++produced;
    events.push_back(GenEvent{s.req.id, {tok}});
    const auto& stops = s.req.stop_tokens;
    if (std::find(stops.begin(), stops.end(), tok) != stops.end()) {
      Finish(s, &events, "stop");
    } else if (static_cast<int>(s.generated.size()) >= s.req.max_tokens) {
      Finish(s, &events, "length");
    }
  }
  // The journal follows the step: what the KV now holds, and what ended.
  for (auto& s : active_) {
    if (s.req.id == 0) {
      journal_.Remove(s.req.request_id, s.hash);
    } else {
      journal_.Describe(s.req.request_id, s.req.prompt, s.generated, s.prefilled, s.blocks, &s.hash);
    }
  }
  journal_.Flush();
  std::erase_if(active_, [](const Seq& s) { return s.req.id == 0; });
  {
    std::lock_guard<std::mutex> lk(mu_);
    ++stats_.steps;
    stats_.generated_tokens += produced;
    stats_.prefill_budget = budget_.PrefillTokens();
    stats_.prefill_us_per_token = budget_.us_per_token();
    stats_.steps_over_bound = budget_.over_bound();
    stats_.longest_prefill_step_us = budget_.longest_prefill_step_us();
  }
  sink_(std::move(events));
}

}  // namespace wsup::engine
