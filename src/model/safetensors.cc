#include "model/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <optional>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

namespace moe {
namespace {

using nlohmann::json;

// The dtypes of the safetensors format that this server cannot use, so that they get a clearer
// message than a misspelled name.
constexpr std::string_view kUnsupportedDTypes[] = {"F64", "I64", "U64",  "U32",    "I16",
                                                   "U16", "U8",  "BOOL", "F8_E5M2"};

std::optional<DType> DTypeFromName(std::string_view name) {
  for (DType d : {DType::kF32, DType::kBF16, DType::kF16, DType::kF8E4M3, DType::kI8, DType::kI32}) {
    if (DTypeName(d) == name) return d;
  }
  return std::nullopt;
}

// A JSON integer in [0, INT64_MAX]: the range of both a dimension and a byte offset we can use.
std::optional<int64_t> NonNegativeInt(const json& j) {
  if (j.is_number_unsigned()) {
    const uint64_t v = j.get<uint64_t>();
    if (v > static_cast<uint64_t>(INT64_MAX)) return std::nullopt;
    return static_cast<int64_t>(v);
  }
  if (j.is_number_integer()) {
    const int64_t v = j.get<int64_t>();
    if (v < 0) return std::nullopt;
    return v;
  }
  return std::nullopt;
}

// A short description of a JSON value for error messages; never dumps a nested value, which could
// be huge or deep.
std::string Describe(const json& j) {
  return j.is_number() || j.is_boolean() || j.is_null() ? j.dump() : j.type_name();
}

Expected<SafetensorsEntry> ParseEntry(const json& j, uint64_t data_size) {
  if (!j.is_object()) return Status::Error("entry is " + Describe(j) + ", not an object");

  const auto dtype_it = j.find("dtype");
  if (dtype_it == j.end() || !dtype_it->is_string()) return Status::Error("'dtype' must be a string");
  const std::string& dtype_name = dtype_it->get_ref<const std::string&>();
  SafetensorsEntry entry;
  if (const auto dtype = DTypeFromName(dtype_name)) {
    entry.dtype = *dtype;
  } else if (std::find(std::begin(kUnsupportedDTypes), std::end(kUnsupportedDTypes), dtype_name) !=
             std::end(kUnsupportedDTypes)) {
    return Status::Error("unsupported dtype '" + dtype_name + "'");
  } else {
    return Status::Error("unknown dtype '" + dtype_name + "'");
  }

  const auto shape_it = j.find("shape");
  if (shape_it == j.end() || !shape_it->is_array()) {
    return Status::Error("'shape' must be a list of non-negative integers");
  }
  // Counted in uint64 with overflow checks: a hostile shape must not wrap around to a small size.
  uint64_t bytes = DTypeSize(entry.dtype);
  bool overflow = false;
  for (const json& d : *shape_it) {
    const auto dim = NonNegativeInt(d);
    if (!dim) {
      return Status::Error("'shape' must be a list of non-negative integers, got " + Describe(d));
    }
    entry.shape.push_back(*dim);
    overflow = overflow || __builtin_mul_overflow(bytes, static_cast<uint64_t>(*dim), &bytes);
  }

  const auto offsets_it = j.find("data_offsets");
  std::optional<int64_t> begin, end;
  if (offsets_it != j.end() && offsets_it->is_array() && offsets_it->size() == 2) {
    begin = NonNegativeInt((*offsets_it)[0]);
    end = NonNegativeInt((*offsets_it)[1]);
  }
  if (!begin || !end) return Status::Error("'data_offsets' must be [begin, end] with non-negative integers");
  entry.begin = static_cast<uint64_t>(*begin);
  entry.end = static_cast<uint64_t>(*end);
  const std::string range =
      "data_offsets [" + std::to_string(entry.begin) + ", " + std::to_string(entry.end) + "]";
  if (entry.begin > entry.end) return Status::Error(range + ": begin is after end");
  if (entry.end > data_size) {
    return Status::Error(range + " are beyond the data section of " + std::to_string(data_size) +
                         " bytes (file truncated?)");
  }
  if (overflow || entry.end - entry.begin != bytes) {
    return Status::Error(range + " hold " + std::to_string(entry.end - entry.begin) + " bytes, but " +
                         std::string(DTypeName(entry.dtype)) + " " + ShapeToString(entry.shape) + " needs " +
                         (overflow ? std::string("more than 2^64") : std::to_string(bytes)));
  }
  return entry;
}

}  // namespace

Expected<SafetensorsHeader> ParseSafetensorsHeader(std::string_view json_text, uint64_t data_size,
                                                   const std::string& source) {
  json root;
  try {
    root = json::parse(json_text.begin(), json_text.end());
  } catch (const json::exception& e) {  // parse_error, or out_of_range for a number overflow
    // what() starts with nlohmann's "[json.exception.parse_error.101] ", which means nothing to a user.
    const std::string what = e.what();
    return Status::Error(source + ": header is not valid JSON: " + what.substr(what.find("] ") + 2));
  }
  if (!root.is_object()) {
    return Status::Error(source + ": header is a JSON " + root.type_name() + ", not an object");
  }

  SafetensorsHeader header;
  for (const auto& [name, value] : root.items()) {
    if (name == "__metadata__") {
      if (!value.is_object()) return Status::Error(source + ": '__metadata__' must be an object of strings");
      for (const auto& [key, text] : value.items()) {
        if (!text.is_string()) {
          return Status::Error(source + ": '__metadata__' value '" + key + "' must be a string");
        }
        header.metadata[key] = text.get<std::string>();
      }
      continue;
    }
    auto entry = ParseEntry(value, data_size);
    if (!entry.ok()) return entry.status().WithContext(source + ": tensor '" + name + "'");
    header.tensors.emplace(name, std::move(entry).value());
  }

  // Sorted by begin, each non-empty range must start at or after the end of the one before.
  std::vector<std::pair<const std::string*, const SafetensorsEntry*>> ranges;
  for (const auto& [name, entry] : header.tensors) {
    if (entry.begin != entry.end) ranges.emplace_back(&name, &entry);
  }
  std::sort(ranges.begin(), ranges.end(),
            [](const auto& a, const auto& b) { return a.second->begin < b.second->begin; });
  for (size_t i = 1; i < ranges.size(); ++i) {
    const auto& [prev_name, prev] = ranges[i - 1];
    const auto& [name, entry] = ranges[i];
    if (entry->begin < prev->end) {
      return Status::Error(source + ": tensor '" + *name + "': data_offsets [" +
                           std::to_string(entry->begin) + ", " + std::to_string(entry->end) +
                           "] overlap tensor '" + *prev_name + "' [" + std::to_string(prev->begin) + ", " +
                           std::to_string(prev->end) + "]");
    }
  }
  return header;
}

Expected<std::unique_ptr<SafetensorsFile>> SafetensorsFile::Open(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return Status::Error(path + ": cannot open: " + std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    return Status::Error(path + ": not a regular file");
  }
  const uint64_t file_size = static_cast<uint64_t>(st.st_size);
  if (file_size < 8) {
    ::close(fd);
    return Status::Error(path + ": file is " + std::to_string(file_size) +
                         " bytes, too short for the 8-byte header length");
  }
  void* mapping = ::mmap(nullptr, file_size, PROT_READ, MAP_PRIVATE, fd, 0);
  const int mmap_errno = errno;
  ::close(fd);  // the mapping keeps the file alive
  if (mapping == MAP_FAILED) return Status::Error(path + ": cannot mmap: " + std::strerror(mmap_errno));

  std::unique_ptr<SafetensorsFile> file(new SafetensorsFile());
  file->path_ = path;
  file->mapping_ = mapping;
  file->mapping_size_ = file_size;

  const auto* bytes = static_cast<const uint8_t*>(mapping);
  uint64_t header_size = 0;
  for (int i = 7; i >= 0; --i) header_size = header_size << 8 | bytes[i];
  if (header_size > file_size - 8) {
    return Status::Error(path + ": header length " + std::to_string(header_size) +
                         " is beyond the end of the file (" + std::to_string(file_size) + " bytes)");
  }
  const std::string_view header_text(reinterpret_cast<const char*>(bytes + 8), header_size);
  MOE_ASSIGN_OR_RETURN(file->header_, ParseSafetensorsHeader(header_text, file_size - 8 - header_size, path));
  file->data_ = bytes + 8 + header_size;
  return file;
}

SafetensorsFile::~SafetensorsFile() {
  if (mapping_ != nullptr) ::munmap(mapping_, mapping_size_);
}

const SafetensorsEntry* SafetensorsFile::Find(const std::string& name) const {
  const auto it = header_.tensors.find(name);
  return it == header_.tensors.end() ? nullptr : &it->second;
}

}  // namespace moe
