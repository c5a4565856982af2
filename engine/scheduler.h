// Scheduler: continuous batching on one thread. Requests are queued by the
// HTTP loop (Submit, never blocking on model work); the scheduler thread
// admits them as KV blocks allow, and each step runs, in one forward pass,
// the prompt tokens of newly admitted sequences and the next token of every
// running one. New tokens leave through the Sink after each step, which the
// server hands back to its loop with uv_async.
//
// KV cache: paged, blocks of block_size positions (the free ones are a
// BlockAllocator, engine/block_allocator.h). A sequence reserves all the
// blocks it can need (prompt + max_tokens) when admitted, so a running
// sequence never waits for memory; a request that could never fit is
// refused at Submit() with a message saying how much fits.
//
// An engine over the node's KV pool (engine/kv_memory.h) has two kinds of
// blocks: its scratch, always there, and the pool's, usable only while the
// pool is open here. OpenPool() maps the pool at once, on a thread of its
// own, while the current step goes on (a step of a large model takes tens
// of milliseconds, and a promoted engine must not wait for one to have its
// KV back), and the next step boundary hands its blocks out (first, before
// the scratch's). ClosePool() stops handing them out at once, lets the
// sequences that hold some run to their end, and then, between two steps,
// unmaps the pool and says so; in between the engine goes on serving from
// its scratch. A request that fits the scratch and the pool together but
// not what is free now waits for blocks, as any request does.
//
// The active engine keeps a journal of its sequences in the pool's first
// blocks (engine/pool_journal.h over the format of wire/kv_journal.h;
// docs/kv_journal.md): after each step, every
// sequence whose KV is wholly in the pool and that has a request id is
// described (positions with KV, their tokens' hash, their blocks), and a
// finished or cancelled one is freed; one copy of the changed bytes per
// step. When the pool opens, the previous engine's journal is read (and
// counted) before a fresh one is written.
//
// Between steps (and while idle) the scheduler runs the communicator
// keepalive every keepalive_ms and records its outcome.
//
// Time: every time the scheduler reads or waits for (the keepalive, a
// resume's wait for the pool, how long the previous engine's pages are
// kept, the shortest step, the debug log's timings) is its EngineClock's
// (engine/clock.h): the steady clock, or a test's fake one.
//
// Threads: Submit, Cancel and stats() from any thread; the Sink is called
// on the scheduler thread. The runner is used only by the scheduler thread
// once Start() has run.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <unordered_set>
#include <vector>

#include "common/status.h"
#include "engine/block_allocator.h"
#include "engine/clock.h"
#include "engine/pool_journal.h"
#include "engine/runner.h"
#include "engine/step_budget.h"

namespace wsup::engine {

struct SchedulerOptions {
  int max_batch = 64;          // sequences in one step
  int max_step_tokens = 2048;  // prompt tokens per step; longer prompts are split over steps
  int max_waiting = 1024;      // queued requests beyond which Submit() refuses
  int64_t keepalive_ms = 1000;
  // Adopting a dead engine's KV (see above); 0 turns holding (or keeping) off.
  int64_t adopt_wait_ms = 2000;
  int64_t adopt_keep_ms = 10'000;
  // What this engine's KV bytes mean (KvJournalGeometry::kv_format): a
  // journal of another model, sharding or engine is never adopted.
  uint64_t kv_format = 0;
  // A step takes at least this long (0: off). Paces generation for drills
  // and demos, which need a stream slow enough to cut in the middle.
  int64_t min_step_ms = 0;
  // A step's prefill is sized to end within this (engine/step_budget.h;
  // 0: max_step_tokens alone bounds it). Every running stream's next token
  // goes in every step whatever the prompts waiting.
  int64_t max_step_ms = 0;
};

struct GenRequest {
  uint64_t id = 0;
  std::vector<int32_t> prompt;
  int max_tokens = 16;
  double temperature = 0;  // 0: greedy
  uint64_t seed = 0;
  std::vector<int32_t> stop_tokens;  // end-of-sequence ids
  std::string request_id;            // the front's X-Request-Id: the KV journal's key (empty: not journaled)
  bool resumed = false;              // the front resumes a stream cut by a failure: adopt its KV if it can
  // The supervisor's health probe: admitted ahead of the waiting requests,
  // and its prompt first in the next step's prefill budget, so that its
  // latency says whether the engine is healthy, not how long the other
  // prompts are.
  bool probe = false;
  int64_t submitted_us = 0;          // the scheduler's clock, set by Submit(): the request's timing in the debug log
};

struct GenEvent {
  uint64_t id = 0;
  std::vector<int32_t> tokens;  // new since the previous event
  bool done = false;
  std::string finish_reason;    // when done: "length" or "stop"
  std::optional<Error> error;   // when done by failure
};

struct SchedulerStats {
  bool running = false;
  int active = 0;
  int waiting = 0;
  int free_blocks = 0;
  int total_blocks = 0;       // usable now: the scratch, and the pool's while it is open
  bool pool_mapped = false;   // the node's KV pool is mapped here
  bool pool_closing = false;  // ClosePool(): waiting for its blocks to come back
  int pool_blocks_in_use = 0;
  // The KV journal in the pool (wire/kv_journal.h), while the pool is open here.
  bool journal = false;
  int journal_blocks = 0;      // pool blocks it takes
  int journal_entries = 0;     // sequences it describes now
  int journal_found = 0;       // valid entries of the previous engine found when the pool was opened
  uint64_t journal_writes = 0;
  uint64_t journal_errors = 0;
  // Resumed requests (GenRequest::resumed) and the previous engine's KV.
  uint64_t adopted_sequences = 0;
  uint64_t adopted_tokens = 0;   // positions not computed again
  uint64_t adopted_by_page = 0;  // of the sequences: adopted up to a page boundary (the stream was behind)
  uint64_t recomputed_sequences = 0;
  std::map<std::string, uint64_t>
      recomputed_reasons;  // KvJournalMissName(), or pool_not_granted, no_request_id
  int resume_held = 0;     // waiting for the pool now
  uint64_t resume_held_total = 0;
  int64_t resume_held_max_ms = 0;  // the longest wait for the pool
  int adoptable_blocks = 0;        // the previous engine's pages still kept for a resume
  uint64_t released_blocks = 0;  // of those, freed unclaimed (after adopt_keep_ms, or for a waiting request)
  uint64_t steps = 0;
  uint64_t probes = 0;  // requests admitted as the supervisor's probes (GenRequest::probe)
  uint64_t generated_tokens = 0;
  uint64_t prompt_tokens = 0;  // of the requests taken (Submit), resumed ones' whole prompts included
  uint64_t finished = 0;   // requests that ran to their end (length, stop or error)
  uint64_t cancelled = 0;  // requests dropped by Cancel() while waiting or running (their client left)
  // The step bound (engine/step_budget.h): the budget the next step gets,
  // the learnt cost of a prompt token, the steps with prefill over the
  // bound and the longest of them.
  int prefill_budget = 0;
  double prefill_us_per_token = 0;
  uint64_t steps_over_bound = 0;
  int64_t longest_prefill_step_us = 0;
  // Communicator keepalive.
  bool comm_ok = true;
  std::string comm_error;
  uint64_t keepalives = 0;
  uint64_t keepalive_failures = 0;
  int64_t last_keepalive_mono_ms = 0;  // when the last one succeeded (the scheduler's clock: steady)
  int64_t last_keepalive_us = 0;       // how long it took
};

class Scheduler {
 public:
  using Sink = std::function<void(std::vector<GenEvent>)>;

  // clock: outlives the scheduler (the steady clock when not given).
  Scheduler(ModelRunner* runner, SchedulerOptions opts, Sink sink,
            const EngineClock& clock = SteadyEngineClock());
  ~Scheduler();
  Scheduler(const Scheduler&) = delete;
  Scheduler& operator=(const Scheduler&) = delete;

  void Start();
  // Stops the thread; requests still queued or running get no more events.
  void Stop();

  // Queues a request. InvalidArgument when it can never fit (context or KV
  // cache), Unavailable when the queue is full or the communicator failed.
  Status Submit(GenRequest req);
  // Drops a request (its client went away); its blocks are freed at once.
  void Cancel(uint64_t id);

  SchedulerStats stats() const;
  // Positions one sequence may use: the model's context, bounded by the KV
  // cache (the scratch and the pool together).
  int64_t max_sequence_tokens() const;

  // The node's KV pool (a pooled runner only). `fetch` gets every rank's
  // pool fds; it and the mapping run on the mapping thread. `done` is
  // called once the pool is mapped (its blocks are handed out at the next
  // step boundary), or with why not, on the mapping or the scheduler
  // thread. Opening an open pool is done at once; opening one that is
  // closing keeps it.
  using PoolFetch = std::function<Result<std::vector<std::vector<UniqueFd>>>()>;
  using PoolDone = std::function<void(Status)>;
  void OpenPool(PoolFetch fetch, PoolDone done);
  // No new sequence gets a pool block; `done` once the last sequence that
  // holds one has ended and the pool is unmapped on every rank.
  void ClosePool(PoolDone done);

 private:
  struct Seq {
    GenRequest req;
    std::vector<int32_t> blocks;
    size_t prefilled = 0;              // prompt tokens already in the cache
    std::vector<int32_t> generated;
    std::mt19937_64 rng;
    JournalHash hash;  // of the tokens the journal describes (prompt, then generated)
    int64_t held_until_ms = 0;    // a resumed request waiting for the pool: until then
    int64_t held_since_ms = 0;
    bool adopt_tried = false;
    // Steady-clock times for the debug log's line at the end (Finish):
    // the first token, the latest, and the longest wait between two.
    int64_t first_token_us = 0;
    int64_t last_token_us = 0;
    int64_t longest_gap_us = 0;
  };

  void Loop();
  void RunKeepalive();
  void Admit();
  void StepOnce();
  void Finish(Seq& s, std::vector<GenEvent>* events, std::string reason, std::optional<Error> error = {});
  int32_t Sample(Seq& s, const float* logits);
  int BlocksFor(int64_t tokens) const;
  void RunPoolCommands();
  void MaybeFinishClose();
  // The pool's counters in stats_ (mu_ held), and a PoolDone called after
  // them, so that an answer never reads stats older than the change.
  void PoolStatsLocked();
  void Done(const PoolDone& done, const Status& st);
  // The mapping thread's work, its start (mu_ held by lk; released while
  // the last mapping thread is joined), and the scheduler thread's side.
  void MapPool(const PoolFetch& fetch);
  void StartMapping(std::unique_lock<std::mutex>& lk, PoolFetch fetch, PoolDone done);
  void HandOutPool();
  // Pool blocks the KV journal takes (never handed out).
  int JournalBlocks() const { return journal_.blocks(); }
  // Resumes: whether one waits for the pool now; adopting (or counting why
  // not) at admission; held requests past their bound; the previous
  // journal's pages let go (the bound passed, or `all` for a request that
  // needs blocks).
  bool HoldsForPool() const;
  void TryAdopt(Seq& s);
  void ExpireHeld(int64_t now);
  void ReleaseUnclaimed(const char* why);
  // Pool blocks kept from use (the journal, and pages kept for resumes).
  std::vector<bool> KeptPoolBlocks() const { return journal_.Kept(runner_->kv_layout().pool_blocks); }

  ModelRunner* runner_;
  SchedulerOptions opts_;
  Sink sink_;
  const EngineClock& clock_;
  std::thread thread_;

  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::deque<GenRequest> incoming_;
  std::unordered_set<uint64_t> cancels_;
  struct PoolCommand {
    bool open = false;
    PoolFetch fetch;
    PoolDone done;
  };
  std::deque<PoolCommand> pool_cmds_;
  // Mapping the pool, off the scheduler thread (guarded by mu_).
  enum class MapPhase { kIdle, kMapping, kMapped };  // kMapped: its blocks not handed out yet
  MapPhase map_phase_ = MapPhase::kIdle;
  std::vector<PoolDone> map_waiters_;
  std::thread map_thread_;
  SchedulerStats stats_;

  // Scheduler thread only.
  std::deque<Seq> waiting_;
  std::vector<Seq> active_;
  BlockAllocator blocks_;  // the pool's handed out while pool_ is open
  StepBudget budget_;      // the scheduler thread's: how much prefill the next step takes
  PoolJournal journal_;    // this engine's journal, and the previous engine's pages
  enum class PoolState { kClosed, kOpen, kClosing };
  PoolState pool_ = PoolState::kClosed;
  std::vector<PoolDone> close_waiters_;  // ClosePool() callers, until the pool is unmapped
  int64_t next_keepalive_ms_ = 0;
  uint64_t finished_ = 0;
  uint64_t cancelled_ = 0;
  std::vector<float> logits_;
  // Resumes.
  std::deque<Seq> held_;  // resumed requests waiting for the pool, in arrival order
  uint64_t held_total_ = 0;
  int64_t held_max_ms_ = 0;
};

}  // namespace wsup::engine
