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

#include "checkpoint/checkpoint.h"
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
// nearest existing parent is one.
std::string FolderProblem(const std::string& dir) {
  std::filesystem::path p(dir);
  std::error_code ec;
  while (!p.empty()) {
    struct stat st{};
    if (::stat(p.c_str(), &st) == 0) {
      if (!S_ISDIR(st.st_mode)) return p.string() + " exists and is not a folder";
      if (::access(p.c_str(), W_OK | X_OK) != 0) {
        return p.string() == dir ? dir + " is not writable by this user"
                                 : dir + " cannot be created: " + p.string() + " is not writable by this user";
      }
      return "";
    }
    if (!p.has_parent_path() || p.parent_path() == p) break;
    p = p.parent_path();
  }
  return dir + " cannot be created (no existing parent folder)";
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
    } else if (c.parallel.expert_parallel) {
      // Expert parallelism needs routed experts that the ranks can share
      // evenly; the holders would refuse anything else at start.
      auto text = ReadFile(JoinPath(m, "config.json"), kMaxConfigBytes);
      auto mc =
          text.ok() ? ParseModelConfig(*text, JoinPath(m, "config.json")) : Result<ModelConfig>(text.error());
      if (!mc.ok()) {
        add("model.path", mc.error().message());
      } else if (mc->num_experts <= 0) {
        add("parallel.expert_parallel", "is true, but " + m + " (" + mc->architecture +
                                            ") has no routed experts to partition; remove expert_parallel");
      } else if (mc->num_experts % c.parallel.tp != 0) {
        add("parallel.expert_parallel",
            "is true, but the " + std::to_string(mc->num_experts) + " experts of " + m +
                " do not divide among parallel.tp = " + std::to_string(c.parallel.tp) +
                " ranks; choose a tp that divides " + std::to_string(mc->num_experts) +
                ", or remove expert_parallel to split every expert by tensor parallelism");
      }
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
    if (!p.empty()) add(key, p + "; choose a folder this user can write, or create it with the right owner");
  }
  return out;
}

}  // namespace wsup
