// The descriptors, one file each (llama.cc, qwen3_moe.cc, deepseek_v3.cc);
// Architectures() (architecture.cc) lists them. Internal to checkpoint/architecture/.
#pragma once

#include "checkpoint/architecture/architecture.h"

namespace wsup::families {

// LlamaForCausalLM and the architectures that share its tensor names.
const Architecture& Llama();
const Architecture& Mistral();
const Architecture& Qwen2();
const Architecture& Qwen3();
const Architecture& Qwen3Moe();
const Architecture& DeepseekV3();

}  // namespace wsup::families
