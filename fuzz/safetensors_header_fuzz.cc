// Feeds arbitrary bytes to ParseSafetensorsHeader as the start of a file. The
// parser must never read outside the bytes it is given, crash, or accept a
// tensor whose range lies outside the file, whatever the input.
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "checkpoint/checkpoint.h"

namespace {

void CheckAccepted(const wsup::SafetensorsHeader& h, uint64_t file_size) {
  for (const wsup::TensorInfo& t : h.tensors) {
    if (t.offset < 8 + h.header_len || t.offset > file_size || t.nbytes > file_size - t.offset) std::abort();
    uint64_t n = wsup::DTypeSize(t.dtype);
    for (int64_t d : t.shape) {
      if (d < 0) std::abort();
      n *= static_cast<uint64_t>(d);  // validated: cannot overflow when accepted
    }
    if (n != t.nbytes) std::abort();
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  // A copy of exactly `size` bytes, so ASan reports any read past the end.
  std::vector<uint8_t> buf(data, data + size);
  const uint8_t* p = buf.empty() ? nullptr : buf.data();
  auto r = wsup::ParseSafetensorsHeader(p, size, size, "fuzz.safetensors");
  if (r.ok()) CheckAccepted(*r, size);
  // The file may be larger than the bytes read so far (Open reads only the
  // header): claim a larger file and pass only the prefix.
  if (size >= 8) {
    uint64_t big = size + 4096;
    auto r2 = wsup::ParseSafetensorsHeader(p, size, big, "fuzz.safetensors");
    if (r2.ok()) CheckAccepted(*r2, big);
  }
  return 0;
}
