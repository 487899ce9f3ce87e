// The safetensors format: an 8-byte little-endian header length, a JSON header mapping tensor
// names to {dtype, shape, data_offsets}, then the data section. Parsing is separate from file I/O
// so that it can be fuzzed.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>

#include "base/status.h"
#include "tensor/tensor.h"

namespace moe {

struct SafetensorsEntry {
  DType dtype = DType::kF32;
  Shape shape;
  uint64_t begin = 0;  // offsets into the data section
  uint64_t end = 0;
};

struct SafetensorsHeader {
  std::map<std::string, SafetensorsEntry> tensors;
  std::map<std::string, std::string> metadata;  // "__metadata__"
};

// Parses the JSON header and validates every entry against a data section of `data_size` bytes:
// known dtype, non-negative shape, byte size matching dtype x shape, offsets inside the section
// and not overlapping. `source` names the file in error messages.
Expected<SafetensorsHeader> ParseSafetensorsHeader(std::string_view json, uint64_t data_size,
                                                   const std::string& source);

class SafetensorsFile {
 public:
  static Expected<std::unique_ptr<SafetensorsFile>> Open(const std::string& path);
  ~SafetensorsFile();

  const std::string& path() const { return path_; }
  const SafetensorsHeader& header() const { return header_; }
  const SafetensorsEntry* Find(const std::string& name) const;
  const uint8_t* Data(const SafetensorsEntry& entry) const { return data_ + entry.begin; }

 private:
  SafetensorsFile() = default;
  std::string path_;
  SafetensorsHeader header_;
  void* mapping_ = nullptr;
  size_t mapping_size_ = 0;
  const uint8_t* data_ = nullptr;
};

}  // namespace moe
