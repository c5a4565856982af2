#include "checkpoint/sharding.h"

#include <algorithm>
#include <cstring>
#include <optional>
#include <span>

#include "checkpoint/json_text.h"

namespace wsup {

namespace {

constexpr std::string_view kScaleSuffix = "_scale_inv";  // "<w>.weight" + "_scale_inv"
constexpr int kMaxTpToSuggest = 64;

bool EndsWith(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}

using checkpoint_text::QuoteTensor;

std::string JoinInts(const std::vector<int>& v) {
  std::string s;
  for (size_t i = 0; i < v.size(); ++i) {
    if (i) s += ", ";
    if (i == 16) return s + "...";
    s += std::to_string(v[i]);
  }
  return s.empty() ? "none" : s;
}

uint64_t Product(const std::vector<int64_t>& shape, size_t from) {
  uint64_t n = 1;
  for (size_t i = from; i < shape.size(); ++i) n *= static_cast<uint64_t>(shape[i]);
  return n;
}

// The rank's slice of one tensor.
struct Plan {
  Split split = Split::kReplicate;
  int64_t start = 0;
  int64_t len = 0;   // along the split dimension
  bool held = true;  // false: another rank's expert under expert parallelism
};

// How a head-split dimension is made: `heads` heads of `per_head` each; the
// names are config.json's keys, for messages.
struct HeadLayout {
  int64_t heads;
  int64_t per_head;
  const char* heads_key;
  const char* per_head_key;
};

HeadLayout HeadsOf(Unit unit, const ModelConfig& c) {
  switch (unit) {
    case Unit::kKvHeads:
      return {c.num_key_value_heads, c.head_dim, "num_key_value_heads", "head_dim"};
    case Unit::kMlaQHeads:
      return {c.num_attention_heads, c.qk_nope_head_dim + c.qk_rope_head_dim, "num_attention_heads",
              "(qk_nope_head_dim + qk_rope_head_dim)"};
    case Unit::kMlaKvHeads:
      return {c.num_attention_heads, c.qk_nope_head_dim + c.v_head_dim, "num_attention_heads",
              "(qk_nope_head_dim + v_head_dim)"};
    case Unit::kMlaVHeads:
      return {c.num_attention_heads, c.v_head_dim, "num_attention_heads", "v_head_dim"};
    default:
      return {c.num_attention_heads, c.head_dim, "num_attention_heads", "head_dim"};
  }
}

struct PlanError {
  Error error;
  // A refusal that another tp size could fix: PlanShards then lists the
  // sizes that would work for the whole checkpoint.
  bool tp_fixable;
};

// Sizes t in [1, kMaxTpToSuggest] for which `ok(t)` holds.
template <typename F>
std::vector<int> SizesWhere(F ok) {
  std::vector<int> v;
  for (int t = 1; t <= kMaxTpToSuggest; ++t) {
    if (ok(t)) v.push_back(t);
  }
  return v;
}

class Planner {
 public:
  // arch nullptr: an architecture without a descriptor, whose tensors match no rule.
  Planner(const Checkpoint& ckpt, const ShardSpec& spec, const Architecture* arch)
      : ckpt_(ckpt), cfg_(ckpt.config()), spec_(spec), arch_(arch) {
    const auto& bs = cfg_.quant.weight_block_size;
    if (bs.size() == 2) {
      block_[0] = bs[0];
      block_[1] = bs[1];
    }
  }

  // Plans one tensor that is not a block scale.
  Plan PlanWeight(const TensorInfo& t, std::optional<PlanError>* err) const {
    const int tp = spec_.tp_size;
    Plan p;
    if (tp == 1) return p;
    const TensorRule* rule = arch_ ? arch_->Match(t.name) : nullptr;
    if (!rule) {
      *err = PlanError{
          Refused(ckpt_.dir() + ": tensor " + QuoteTensor(t.name) + " matches no tensor-parallel rule for " +
                  cfg_.architecture + ", so wsup cannot tell how to split it across " + std::to_string(tp) +
                  " ranks; use tp_size 1, or add the tensor to the family's descriptor in "
                  "checkpoint/architecture/"),
          false};
      return p;
    }
    if (rule->role == Role::kRoutedExpert && spec_.ep_size > 1) {
      // Whole experts: rank r holds [r*E/ep, (r+1)*E/ep). The index was
      // checked against num_experts (ValidateArchitecture).
      int64_t layer = -1, e = -1;
      if (!RoutedExpertOf(*arch_, t.name, &layer, &e)) {
        *err = PlanError{
            Corrupt(ckpt_.dir() + ": tensor " + QuoteTensor(t.name) +
                    " is named like a routed expert but has no expert number after 'experts.', so "
                    "wsup cannot tell which rank holds it; the checkpoint is damaged: re-download it"),
            false};
        return p;
      }
      const int64_t per_rank = cfg_.num_experts / spec_.ep_size;
      p.held = e >= spec_.ep_rank * per_rank && e < (spec_.ep_rank + 1) * per_rank;
      return p;
    }
    p.split = rule->split;
    if (p.split == Split::kReplicate) return p;
    const size_t dim = p.split == Split::kRows ? 0 : 1;
    if (t.shape.size() <= dim) {
      *err =
          PlanError{Corrupt(ckpt_.dir() + ": tensor " + QuoteTensor(t.name) + " has " +
                            std::to_string(t.shape.size()) + " dimensions, but its rule splits dimension " +
                            std::to_string(dim) + "; the checkpoint does not match its architecture " +
                            cfg_.architecture + ": check config.json"),
                    false};
      return p;
    }
    const int64_t size = t.shape[dim];
    const std::string what = ckpt_.dir() + ": tensor " + QuoteTensor(t.name) + ": dimension " +
                             std::to_string(dim) + " (" + std::to_string(size) + ")";

    if (rule->unit != Unit::kEven) {
      const HeadLayout hl = HeadsOf(rule->unit, cfg_);
      const int64_t heads = hl.heads;
      const char* key = hl.heads_key;
      if (size != heads * hl.per_head || hl.per_head <= 0) {
        *err = PlanError{Corrupt(what + " is not " + key + " x " + hl.per_head_key + " = " +
                                 std::to_string(heads) + " x " + std::to_string(hl.per_head) +
                                 " from config.json; the config and the weights belong to different models: "
                                 "restore the matching config.json"),
                         false};
        return p;
      }
      if (rule->unit == Unit::kKvHeads && tp > heads) {
        // More ranks than KV heads: each rank holds one whole head, shared
        // by tp / heads ranks.
        if (tp % heads != 0) {
          *err = PlanError{
              Refused(what + ": tp_size " + std::to_string(tp) + " exceeds the " + std::to_string(heads) +
                      " KV heads but is not a multiple of them, so heads "
                      "cannot be replicated evenly; choose a tp_size that divides " +
                      key + " or is a multiple of it"),
              true};
          return p;
        }
        p.start = spec_.tp_rank * heads / tp * hl.per_head;
        p.len = hl.per_head;
      } else {
        if (heads % tp != 0) {
          *err = PlanError{
              Refused(what + ": " + key + " " + std::to_string(heads) + " is not divisible by tp_size " +
                      std::to_string(tp) + ", so heads would be cut; tp sizes that divide it: " +
                      JoinInts(SizesWhere([&](int s) { return heads % s == 0; }))),
              true};
          return p;
        }
        p.len = size / tp;
        p.start = spec_.tp_rank * p.len;
      }
    } else {
      if (size % tp != 0) {
        *err = PlanError{Refused(what + " is not divisible by tp_size " + std::to_string(tp) +
                                 "; tp sizes that divide it: " +
                                 JoinInts(SizesWhere([&](int s) { return size % s == 0; }))),
                         true};
        return p;
      }
      p.len = size / tp;
      p.start = spec_.tp_rank * p.len;
    }

    // Block FP8: the rank's part must consist of whole 128x128 blocks, or
    // its scales would describe bytes another rank holds.
    if (const TensorInfo* scale = ckpt_.Find(t.name + std::string(kScaleSuffix)); scale && block_[0] > 0) {
      const int64_t b = block_[dim];
      if (p.len % b != 0 || p.start % b != 0) {
        // The first block the rank's part starts or ends inside.
        const int64_t cut = p.start % b != 0 ? p.start : p.start + p.len;
        const int64_t block = cut / b;
        const char* unit_name = dim == 0 ? "rows" : "columns";
        const std::string where = "rank " + std::to_string(spec_.tp_rank) + "'s " + unit_name + " [" +
                                  std::to_string(p.start) + ", " + std::to_string(p.start + p.len) + ") " +
                                  (cut == p.start ? "start" : "end") + " inside block " +
                                  (dim == 0 ? "row " : "column ") + std::to_string(block) + " (" + unit_name +
                                  " " + std::to_string(block * b) + " to " +
                                  std::to_string(std::min(size, (block + 1) * b) - 1) + ")";
        auto ok = [&](int s) {
          if (rule->unit == Unit::kKvHeads && s > cfg_.num_key_value_heads) {
            return s % cfg_.num_key_value_heads == 0 && cfg_.head_dim % b == 0;
          }
          if (rule->unit != Unit::kEven && HeadsOf(rule->unit, cfg_).heads % s != 0) return false;
          return size % s == 0 && (size / s) % b == 0;
        };
        *err = PlanError{
            Refused(what + ": tp_size " + std::to_string(tp) + " gives each rank " + std::to_string(p.len) +
                    (dim == 0 ? " rows" : " columns") + ", which cuts through its " +
                    std::to_string(block_[0]) + "x" + std::to_string(block_[1]) + " FP8 scale blocks (" +
                    QuoteTensor(scale->name) + "): " + where +
                    "; tp sizes that keep this tensor's blocks whole: " + JoinInts(SizesWhere(ok))),
            true};
        return p;
      }
    }
    return p;
  }

  // Checks a block scale against its weight and derives its slice.
  Plan PlanScale(const TensorInfo& scale, const TensorInfo& weight, const Plan& wp,
                 std::optional<PlanError>* err) const {
    Plan p;
    if (block_[0] <= 0) {
      *err = PlanError{
          Corrupt(ckpt_.dir() + ": tensor " + QuoteTensor(scale.name) +
                  " is a block scale, but config.json's quantization_config has no weight_block_size; "
                  "restore the matching config.json"),
          false};
      return p;
    }
    bool shape_ok = weight.shape.size() == 2 && scale.shape.size() == 2 &&
                    scale.shape[0] == (weight.shape[0] + block_[0] - 1) / block_[0] &&
                    scale.shape[1] == (weight.shape[1] + block_[1] - 1) / block_[1];
    if (!shape_ok) {
      *err = PlanError{Corrupt(ckpt_.dir() + ": tensor " + QuoteTensor(scale.name) +
                               " does not hold one scale per " + std::to_string(block_[0]) + "x" +
                               std::to_string(block_[1]) + " block of " + QuoteTensor(weight.name) +
                               "; the checkpoint is damaged or its config.json belongs to "
                               "another model: re-download it"),
                       false};
      return p;
    }
    p.split = wp.split;
    p.held = wp.held;
    if (p.split == Split::kReplicate) return p;
    const int64_t b = block_[p.split == Split::kRows ? 0 : 1];
    p.start = wp.start / b;
    p.len = wp.len / b;
    return p;
  }

  Status PlanAll(std::vector<ShardedTensor>* out) const {
    const auto& tensors = ckpt_.tensors();
    for (size_t i = 0; i < tensors.size(); ++i) {
      const TensorInfo& t = tensors[i];
      std::optional<PlanError> err;
      Plan p;
      if (EndsWith(t.name, kScaleSuffix) &&
          ckpt_.Find(t.name.substr(0, t.name.size() - kScaleSuffix.size()))) {
        const TensorInfo& w = *ckpt_.Find(t.name.substr(0, t.name.size() - kScaleSuffix.size()));
        Plan wp = PlanWeight(w, &err);
        if (!err) p = PlanScale(t, w, wp, &err);
      } else {
        p = PlanWeight(t, &err);
      }
      if (err) {
        last_fixable_ = err->tp_fixable;
        return err->error;
      }
      if (!out || !p.held) continue;
      ShardedTensor s;
      s.name = t.name;
      s.dtype = t.dtype;
      s.shape = t.shape;
      s.source = i;
      s.split = p.split;
      if (p.split != Split::kReplicate) {
        s.start = p.start;
        s.shape[p.split == Split::kRows ? 0 : 1] = p.len;
      }
      s.nbytes = Product(s.shape, 0) * DTypeSize(t.dtype);
      out->push_back(std::move(s));
    }
    return Status::Ok();
  }

  bool last_fixable() const { return last_fixable_; }

 private:
  const Checkpoint& ckpt_;
  const ModelConfig& cfg_;
  ShardSpec spec_;
  const Architecture* arch_;
  int64_t block_[2] = {0, 0};
  mutable bool last_fixable_ = false;
};

Status PreadRows(const Checkpoint& ckpt, const TensorInfo& src, const ShardedTensor& t, uint8_t* dst) {
  const uint64_t row_bytes = Product(src.shape, 1) * DTypeSize(src.dtype);
  return ckpt.ReadRange(src.file, src.offset + static_cast<uint64_t>(t.start) * row_bytes, t.nbytes, dst);
}

// Column slices are strided: each source row holds the rank's columns at the
// same offset. Wide slices are read row by row straight into dst; narrow ones
// through a bounce buffer of many whole rows, so a tensor costs a few large
// preads rather than one small pread per row.
Status PreadCols(const Checkpoint& ckpt, const TensorInfo& src, const ShardedTensor& t, uint8_t* dst) {
  constexpr uint64_t kDirectRowBytes = 256 << 10;
  constexpr uint64_t kBounceBytes = 8 << 20;
  const uint64_t esize = DTypeSize(src.dtype);
  const uint64_t inner = Product(src.shape, 2) * esize;
  const uint64_t rows = static_cast<uint64_t>(src.shape[0]);
  const uint64_t src_row = static_cast<uint64_t>(src.shape[1]) * inner;
  const uint64_t part = static_cast<uint64_t>(t.shape[1]) * inner;
  const uint64_t col_off = static_cast<uint64_t>(t.start) * inner;
  if (part == 0 || rows == 0) return Status::Ok();
  if (part >= kDirectRowBytes || rows == 1) {
    for (uint64_t r = 0; r < rows; ++r) {
      WSUP_RETURN_IF_ERROR(
          ckpt.ReadRange(src.file, src.offset + r * src_row + col_off, part, dst + r * part));
    }
    return Status::Ok();
  }
  const uint64_t rows_per_read = std::max<uint64_t>(1, kBounceBytes / src_row);
  std::vector<uint8_t> bounce((rows_per_read - 1) * src_row + part);
  for (uint64_t r = 0; r < rows; r += rows_per_read) {
    const uint64_t k = std::min(rows_per_read, rows - r);
    const uint64_t span = (k - 1) * src_row + part;
    WSUP_RETURN_IF_ERROR(ckpt.ReadRange(src.file, src.offset + r * src_row + col_off, span, bounce.data()));
    for (uint64_t i = 0; i < k; ++i) std::memcpy(dst + (r + i) * part, bounce.data() + i * src_row, part);
  }
  return Status::Ok();
}

}  // namespace

Result<std::vector<ShardedTensor>> PlanShards(const Checkpoint& ckpt, const ShardSpec& spec) {
  if (spec.tp_size < 1 || spec.tp_rank < 0 || spec.tp_rank >= spec.tp_size) {
    return InvalidArgument("tp_size " + std::to_string(spec.tp_size) + " with tp_rank " +
                           std::to_string(spec.tp_rank) + " is not a rank of a group; use tp_size >= 1 and " +
                           "0 <= tp_rank < tp_size");
  }
  if (spec.ep_size < 1 || spec.ep_rank < 0 || spec.ep_rank >= spec.ep_size) {
    return InvalidArgument("ep_size " + std::to_string(spec.ep_size) + " with ep_rank " +
                           std::to_string(spec.ep_rank) + " is not a rank of a group; use ep_size >= 1 and " +
                           "0 <= ep_rank < ep_size");
  }
  if (spec.ep_size > 1 && (spec.ep_size != spec.tp_size || spec.ep_rank != spec.tp_rank)) {
    return InvalidArgument("ep_size " + std::to_string(spec.ep_size) + " (ep_rank " +
                           std::to_string(spec.ep_rank) + ") beside tp_size " + std::to_string(spec.tp_size) +
                           " (tp_rank " + std::to_string(spec.tp_rank) +
                           "): expert parallelism spans the tensor-parallel group, so use ep_size " +
                           std::to_string(spec.tp_size) + " with ep_rank = tp_rank, or ep_size 1");
  }
  const Architecture* arch = FindArchitecture(ckpt.config().architecture);
  if (arch) WSUP_RETURN_IF_ERROR(ValidateArchitecture(ckpt, *arch));
  const int64_t experts = ckpt.config().num_experts;
  if (spec.ep_size > 1 && !(arch && arch->moe)) {
    return Refused(ckpt.dir() + ": architecture '" + ckpt.config().architecture +
                   "' has no routed experts that wsup can partition, so ep_size " +
                   std::to_string(spec.ep_size) + " means nothing for it; use ep_size 1");
  }
  // Sizes this checkpoint can be split into, with or without expert parallelism.
  auto works = [&](int t, bool ep) {
    if (ep && experts % t != 0) return false;
    Planner p(ckpt, ShardSpec{t, 0, ep ? t : 1, 0}, arch);
    return p.PlanAll(nullptr).ok();
  };
  auto sizes_note = [&]() {
    std::string note =
        "; tp sizes this checkpoint can use: " + JoinInts(SizesWhere([&](int t) { return works(t, false); }));
    if (arch && arch->moe) {
      note += "; with expert parallelism (ep_size = tp_size): " +
              JoinInts(SizesWhere([&](int t) { return works(t, true); }));
    }
    return note;
  };
  if (spec.ep_size > 1 && experts % spec.ep_size != 0) {
    return Refused(ckpt.dir() + ": num_experts " + std::to_string(experts) + " is not divisible by ep_size " +
                   std::to_string(spec.ep_size) + ", so the ranks cannot hold equal shares of whole experts" +
                   sizes_note());
  }
  if (spec.tp_size > 1 && !arch) {
    std::string known;
    for (const Architecture* a : Architectures()) known += (known.empty() ? "" : ", ") + a->name;
    return Refused(ckpt.dir() + ": architecture '" + ckpt.config().architecture +
                   "' has no tensor-parallel sharding rules (known: " + known + "); use tp_size 1");
  }
  std::vector<ShardedTensor> out;
  out.reserve(ckpt.tensors().size());
  Planner planner(ckpt, spec, arch);
  Status s = planner.PlanAll(&out);
  if (!s.ok()) {
    if (!planner.last_fixable()) return s.error();
    // Say which sizes would work for the whole checkpoint, not only for the
    // tensor that failed first.
    return Error(s.error().code(), s.error().message() + sizes_note());
  }
  return out;
}

Status ReadShard(const Checkpoint& ckpt, const ShardedTensor& t, void* dst) {
  if (t.source >= ckpt.tensors().size()) {
    return Internal(ckpt.dir() + ": shard of " + QuoteTensor(t.name) + " names source tensor " +
                    std::to_string(t.source) + " but the checkpoint has " +
                    std::to_string(ckpt.tensors().size()));
  }
  const TensorInfo& src = ckpt.tensors()[t.source];
  const int dim = t.split == Split::kRows ? 0 : t.split == Split::kCols ? 1 : -1;
  bool ok = src.dtype == t.dtype && src.shape.size() == t.shape.size() && t.start >= 0 &&
            t.nbytes == Product(t.shape, 0) * DTypeSize(t.dtype);
  for (size_t i = 0; ok && i < t.shape.size(); ++i) {
    ok = static_cast<int>(i) == dim ? t.shape[i] >= 0 && t.start + t.shape[i] <= src.shape[i]
                                    : t.shape[i] == src.shape[i];
  }
  if (!ok) {
    return Internal(ckpt.dir() + ": shard of " + QuoteTensor(t.name) + " does not fit its source tensor " +
                    QuoteTensor(src.name) + "; plan shards with PlanShards() on the same checkpoint");
  }
  auto* out = static_cast<uint8_t*>(dst);
  Status s;
  switch (t.split) {
    case Split::kReplicate:
      s = ckpt.ReadTensor(src, out);
      break;
    case Split::kRows:
      s = PreadRows(ckpt, src, t, out);
      break;
    case Split::kCols:
      s = PreadCols(ckpt, src, t, out);
      break;
  }
  if (!s.ok()) return s.error().With("tensor " + QuoteTensor(t.name));
  return Status::Ok();
}

}  // namespace wsup
