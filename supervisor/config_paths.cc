// CheckConfigPaths: what a config names on this machine, checked before
// anything is started (`wsup check`, and `wsup start` before its first
// child), so that a missing model folder or engine program is one located
// error instead of a crash loop or a degraded node.
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>

#include "checkpoint/checkpoint.h"
#include "checkpoint/sharding.h"
#include "common/fs.h"
#include "supervisor/config.h"

namespace wsup {
namespace {

std::string At(const Config& c, const std::string& key) {
  auto it = c.where.find(key);
  return (it == c.where.end() ? c.path + ":1:1" : it->second) + ": " + key + ": ";
}

// A program as the supervisor will start it: a path (with a '/') must be an
// executable file; a bare name is looked up in PATH like posix_spawnp does.
std::string ProgramProblem(const std::string& program) {
  if (program.empty()) return "the program is empty";
  auto check = [](const std::string& p) -> std::string {
    struct stat st{};
    if (::stat(p.c_str(), &st) != 0) return p + " does not exist";
    if (!S_ISREG(st.st_mode)) return p + " is not a file";
    if (::access(p.c_str(), X_OK) != 0) return p + " is not executable (chmod +x it)";
    return "";
  };
  if (program.find('/') != std::string::npos) return check(program);
  const char* path = std::getenv("PATH");
  std::string dirs = path ? path : "/usr/bin:/bin";
  size_t pos = 0;
  while (pos <= dirs.size()) {
    size_t colon = dirs.find(':', pos);
    if (colon == std::string::npos) colon = dirs.size();
    std::string dir = dirs.substr(pos, colon - pos);
    if (!dir.empty() && check(JoinPath(dir, program)).empty()) return "";
    pos = colon + 1;
  }
  return program + " is not found in PATH (" + dirs + ")";
}

// A folder the supervisor creates: it exists as a writable folder, or its
// nearest existing parent is one. Each way it can be unusable is named: a
// file in its place, a symbolic link loop or one that points nowhere, a
// read-only filesystem, no write permission.
std::string FolderProblem(const std::string& dir) {
  std::filesystem::path p(dir);
  while (!p.empty()) {
    struct stat st{};
    if (::stat(p.c_str(), &st) == 0) {
      if (!S_ISDIR(st.st_mode)) return p.string() + " exists and is not a folder";
      if (::access(p.c_str(), W_OK | X_OK) != 0) {
        const std::string why = errno == EROFS ? " is on a read-only filesystem" : " is not writable by this user";
        return p.string() == dir ? dir + why : dir + " cannot be created: " + p.string() + why;
      }
      return "";
    }
    const int e = errno;
    if (e == ELOOP) {
      // The link itself, not a path through it.
      while (p.has_parent_path() && p.parent_path() != p && ::stat(p.parent_path().c_str(), &st) != 0 &&
             errno == ELOOP) {
        p = p.parent_path();
      }
      return p.string() + " is a symbolic link loop (or a chain of too many links)";
    }
    struct stat lst{};
    if (e == ENOENT && ::lstat(p.c_str(), &lst) == 0 && S_ISLNK(lst.st_mode)) {
      return p.string() + " is a symbolic link to a path that does not exist";
    }
    // Not there (or a file on the way, found further up): its parent decides.
    if (e != ENOENT && e != ENOTDIR) return p.string() + ": " + std::strerror(e);
    if (!p.has_parent_path() || p.parent_path() == p) break;
    p = p.parent_path();
  }
  return dir + " cannot be created (no existing parent folder)";
}

// The state folder's own contents: the logs folder and the ledger must be
// usable where they already exist.
std::string StateDirProblem(const std::string& dir) {
  std::string p = FolderProblem(JoinPath(dir, "logs"));
  if (!p.empty()) return p;
  const std::string db = JoinPath(dir, "wsup.db");
  struct stat st{};
  if (::stat(db.c_str(), &st) == 0) {
    if (!S_ISREG(st.st_mode)) return db + " (the ledger) exists and is not a file";
    if (::access(db.c_str(), R_OK | W_OK) != 0) {
      return db + " (the ledger)" + (errno == EROFS ? " is on a read-only filesystem" : " is not writable by this user");
    }
  }
  return "";
}

// The folder holds no tokenizer of its own: an engine can then only read
// the prompt one token per byte (the reference engine's byte tokenizer).
bool HasTokenizer(const std::string& model) {
  for (const char* name : {"tokenizer.json", "tokenizer.model", "tokenizer_config.json", "vocab.json"}) {
    struct stat st{};
    if (::stat(JoinPath(model, name).c_str(), &st) == 0) return true;
  }
  return false;
}

std::string IdList(const std::vector<int64_t>& ids) {
  std::string s;
  for (size_t i = 0; i < ids.size() && i < 8; ++i) s += (i ? ", " : "") + std::to_string(ids[i]);
  return s + (ids.size() > 8 ? ", ..." : "");
}

using AddFn = std::function<void(const std::string& key, const std::string& what)>;

// What the config asks of the model, against its config.json and (for tp
// above 1) its tensors: what the holders and the engines would refuse at
// start, or what no answer of the model could ever satisfy.
void CheckAgainstModel(const Config& c, const AddFn& add, bool weights) {
  const std::string& m = c.model.path;
  const std::string path = JoinPath(m, "config.json");
  auto text = ReadFile(path, kMaxConfigBytes);
  auto mc = text.ok() ? ParseModelConfig(*text, path) : Result<ModelConfig>(text.error());
  // A group member's ranks are one share of the group's: the model is
  // split by tp x size (docs/config.md, [group]).
  const int members = c.group.enabled() ? c.group.size : 1;
  const int tp = c.parallel.tp * members;
  const std::string ranks = members > 1 ? "parallel.tp x group.size = " + std::to_string(tp)
                                        : "parallel.tp = " + std::to_string(tp);
  bool ep_refused = false;
  if (c.parallel.expert_parallel) {
    // Expert parallelism needs routed experts that the ranks can share
    // evenly; the holders would refuse anything else at start.
    ep_refused = true;
    if (!mc.ok()) {
      add("model.path", mc.error().message());
    } else if (mc->num_experts <= 0) {
      add("parallel.expert_parallel", "is true, but " + m + " (" + mc->architecture +
                                          ") has no routed experts to partition; remove expert_parallel");
    } else if (mc->num_experts % tp != 0) {
      add("parallel.expert_parallel",
          "is true, but the " + std::to_string(mc->num_experts) + " experts of " + m + " do not divide among " +
              ranks + " ranks; choose a tp that divides " + std::to_string(mc->num_experts) +
              ", or remove expert_parallel to split every expert by tensor parallelism");
    } else {
      ep_refused = false;
    }
  }
  // A config.json that cannot be read is the engines' to refuse, with
  // their own words; nothing below can be judged without it.
  if (!mc.ok()) return;

  const auto& p = c.probe;
  if (p.kind == ProbeKind::kSemantic) {
    const int64_t vocab = mc->vocab_size;
    if (p.expect_token_ids && vocab > 0) {
      const auto& ids = *p.expect_token_ids;
      for (size_t i = 0; i < ids.size(); ++i) {
        if (ids[i] < vocab) continue;
        add("probe.expect_token_ids",
            "element " + std::to_string(i + 1) + " (" + std::to_string(ids[i]) + ") of [" + IdList(ids) +
                "] is outside the vocabulary of " + m + " (vocab_size " + std::to_string(vocab) +
                " in config.json: ids 0 to " + std::to_string(vocab - 1) +
                "), so no answer can ever match; give the token ids of this model's answer");
        break;
      }
    }
    const int64_t context = mc->max_position_embeddings;
    if (context > 0 && !HasTokenizer(m)) {
      const auto prompt = static_cast<int64_t>(p.prompt.size());
      const std::string tokens = std::to_string(prompt) + " tokens for " + m +
                                 ", which has no tokenizer of its own (one token per byte)";
      if (prompt >= context) {
        add("probe.prompt", "is " + tokens + ", and the model's context is " + std::to_string(context) +
                                " tokens (max_position_embeddings in config.json), leaving no room for an answer; "
                                "shorten the prompt to at most " + std::to_string(context - 1) + " bytes");
      } else if (prompt + p.max_tokens > context) {
        add("probe.max_tokens", std::to_string(p.max_tokens) + " tokens after the prompt's " + tokens +
                                    ", pass the model's context of " + std::to_string(context) +
                                    " tokens (max_position_embeddings in config.json); lower max_tokens to at most " +
                                    std::to_string(context - prompt) + ", or shorten the prompt");
      }
    } else if (context > 0 && p.max_tokens >= context) {
      // Whatever the tokenizer, the prompt takes at least one token.
      add("probe.max_tokens", std::to_string(p.max_tokens) + " leaves no room for the prompt in the context of " + m +
                                  " (" + std::to_string(context) +
                                  " tokens, max_position_embeddings in config.json); lower max_tokens below " +
                                  std::to_string(context));
    }
  }

  // Tensor parallelism: the holders (checkpoint/sharding.h) and the engines
  // split the tensors by the same rules and refuse a tp that cuts a head,
  // an expert or an FP8 block; the refusal names the sizes that work.
  if (tp > 1 && !ep_refused && weights) {
    auto ckpt = Checkpoint::Open(m);
    if (!ckpt.ok()) {
      add("model.path", ckpt.error().message());
      return;
    }
    auto plan = PlanShards(*ckpt, ShardSpec{tp, 0, c.parallel.expert_parallel ? tp : 1, 0});
    if (!plan.ok()) {
      add("parallel.tp", (members > 1 ? ranks : std::to_string(tp)) +
                             (c.parallel.expert_parallel ? " with expert parallelism" : "") +
                             " cannot split the model: " + plan.error().message() +
                             "; set parallel.tp to a size this checkpoint can use");
    }
  }
}

}  // namespace

std::vector<Error> CheckConfigPaths(const Config& c, const std::string& default_holder) {
  std::vector<Error> out;
  auto add = [&](const std::string& key, const std::string& what) { out.push_back(InvalidArgument(At(c, key) + what)); };

  // The model folder.
  struct stat st{};
  const std::string& m = c.model.path;
  if (::stat(m.c_str(), &st) != 0) {
    add("model.path", m + " does not exist; point it at the Hugging Face checkpoint folder (config.json and "
                          "*.safetensors)");
  } else if (!S_ISDIR(st.st_mode)) {
    add("model.path", m + " is not a folder; point it at the checkpoint folder, not at one of its files");
  } else {
    if (::stat(JoinPath(m, "config.json").c_str(), &st) != 0) {
      add("model.path", m + " has no config.json; it is not a Hugging Face checkpoint folder: point it at the folder "
                            "that holds config.json and the safetensors files");
    }
    bool weights = false;
    std::error_code ec;
    for (const auto& e : std::filesystem::directory_iterator(m, ec)) {
      std::string name = e.path().filename().string();
      if (name.size() > 12 && name.compare(name.size() - 12, 12, ".safetensors") == 0) weights = true;
      if (name == "model.safetensors.index.json") weights = true;
    }
    if (!weights) {
      add("model.path", m + " has no *.safetensors file and no model.safetensors.index.json; download the weights "
                            "into it");
    }
    if (::stat(JoinPath(m, "config.json").c_str(), &st) == 0) CheckAgainstModel(c, add, weights);
  }

  // The programs.
  if (!c.engine.command.empty()) {
    std::string p = ProgramProblem(c.engine.command[0]);
    if (!p.empty()) add("engine.command", "the engine program " + p + "; fix the first element of engine.command");
  }
  if (c.weight_cache.mode == CacheMode::kDaemon) {
    if (!c.holder.command.empty()) {
      std::string p = ProgramProblem(c.holder.command[0]);
      if (!p.empty()) add("holder.command", "the holder program " + p + "; fix the first element of holder.command");
    } else if (!c.holder.binary.empty()) {
      std::string p = ProgramProblem(c.holder.binary);
      if (!p.empty()) add("holder.binary", "the holder program " + p + "; fix holder.binary or remove it to use "
                                           "wsup-holder beside wsup");
    } else if (!default_holder.empty()) {
      std::string p = ProgramProblem(default_holder);
      if (!p.empty()) add("holder.binary", "the default holder program " + p + "; install wsup-holder beside wsup or "
                                           "set holder.binary");
    }
  }

  // The folders the supervisor makes.
  for (const auto& [key, dir] : {std::pair<std::string, std::string>{"node.state_dir", c.node.state_dir},
                                 std::pair<std::string, std::string>{"node.runtime_dir", c.node.runtime_dir}}) {
    std::string p = FolderProblem(dir);
    if (p.empty() && key == "node.state_dir") p = StateDirProblem(dir);
    if (!p.empty()) add(key, p + "; choose a folder this user can write, or create it with the right owner");
  }
  return out;
}

}  // namespace wsup
