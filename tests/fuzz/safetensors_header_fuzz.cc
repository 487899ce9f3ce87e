// libFuzzer target for ParseSafetensorsHeader, the first code to see an untrusted checkpoint.
// Input: 8 bytes little-endian data-section size, then the JSON header. Beyond "no crash, no
// sanitizer report", every header that parses must satisfy the promises the loader relies on.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "model/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 8) return 0;
  uint64_t data_size = 0;
  for (int i = 7; i >= 0; --i) data_size = data_size << 8 | data[i];
  const std::string_view json(reinterpret_cast<const char*>(data + 8), size - 8);

  auto header = moe::ParseSafetensorsHeader(json, data_size, "fuzz");
  if (!header.ok()) return 0;
  for (const auto& [name, entry] : header->tensors) {
    MOE_CHECK(entry.begin <= entry.end && entry.end <= data_size, "offsets of '%s' escape the data",
              name.c_str());
    uint64_t bytes = moe::DTypeSize(entry.dtype);
    for (int64_t d : entry.shape) {
      MOE_CHECK(d >= 0, "negative dimension in '%s'", name.c_str());
      MOE_CHECK(!__builtin_mul_overflow(bytes, static_cast<uint64_t>(d), &bytes), "size of '%s' overflows",
                name.c_str());
    }
    MOE_CHECK(entry.end - entry.begin == bytes, "size of '%s' does not match its shape", name.c_str());
  }
  return 0;
}
