// Helpers for the loader tests: a self-removing temporary directory and safetensors files built
// byte by byte, so that every malformed case can be written exactly.
#pragma once

#include <stdlib.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <string_view>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "base/status.h"
#include "tensor/tensor.h"

namespace moe::test {

class TempDir {
 public:
  TempDir() {
    std::string pattern = (std::filesystem::temp_directory_path() / "moe-loader-test-XXXXXX").string();
    MOE_CHECK(mkdtemp(pattern.data()) != nullptr, "mkdtemp failed");
    path_ = pattern;
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  const std::string& path() const { return path_; }

  // Writes `bytes` to `name` inside the directory and returns the file's full path.
  std::string Write(const std::string& name, std::string_view bytes) const {
    const std::string file = path_ + "/" + name;
    std::ofstream out(file, std::ios::binary);
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    MOE_CHECK(out.good(), "cannot write %s", file.c_str());
    return file;
  }

 private:
  std::string path_;
};

// A safetensors file: 8-byte little-endian header length, `header` verbatim, then `data`.
inline std::string RawSafetensors(std::string_view header, std::string_view data) {
  std::string bytes(8, '\0');
  uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) bytes[i] = static_cast<char>((n >> (8 * i)) & 0xff);
  bytes.append(header);
  bytes.append(data);
  return bytes;
}

struct TensorBytes {
  std::string name;
  std::string dtype;
  Shape shape;
  std::string data;  // little-endian element bytes
};

// A well-formed safetensors file holding `tensors` back to back in the given order.
inline std::string Safetensors(const std::vector<TensorBytes>& tensors) {
  nlohmann::json header = nlohmann::json::object();
  std::string data;
  for (const TensorBytes& t : tensors) {
    header[t.name] = {
        {"dtype", t.dtype}, {"shape", t.shape}, {"data_offsets", {data.size(), data.size() + t.data.size()}}};
    data += t.data;
  }
  return RawSafetensors(header.dump(), data);
}

// The raw bytes of a vector of trivially copyable values.
template <typename T>
std::string Bytes(const std::vector<T>& values) {
  std::string bytes(values.size() * sizeof(T), '\0');
  std::memcpy(bytes.data(), values.data(), bytes.size());
  return bytes;
}

// Expects `result` to have failed with a message containing every one of `parts`.
template <typename T>
void ExpectError(const Expected<T>& result, const std::vector<std::string>& parts) {
  ASSERT_FALSE(result.ok()) << "expected an error containing '" << parts.front() << "'";
  const std::string message = result.status().message();
  for (const std::string& part : parts) {
    EXPECT_NE(message.find(part), std::string::npos) << "'" << part << "' not in: " << message;
  }
}

}  // namespace moe::test
