// Feeds arbitrary text to ParseModelConfig: config.json is read from the
// model folder, which an operator may have edited or half-downloaded. It must
// never crash, and an accepted config must be usable by the sharding rules.
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "checkpoint/checkpoint.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view text(reinterpret_cast<const char*>(data), size);
  auto c = wsup::ParseModelConfig(text, "config.json");
  if (c.ok()) {
    if (c->hidden_size <= 0 || c->num_attention_heads <= 0 || c->num_key_value_heads <= 0 ||
        c->head_dim <= 0) {
      std::abort();
    }
    if (c->num_attention_heads % c->num_key_value_heads != 0) std::abort();
  }
  return 0;
}
