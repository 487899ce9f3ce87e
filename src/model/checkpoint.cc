#include "model/checkpoint.h"

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <sstream>

#include <nlohmann/json.hpp>

#include "base/log.h"
#include "base/thread_pool.h"
#include "model/safetensors.h"

namespace moe {
namespace {

using nlohmann::json;

constexpr const char* kIndexFile = "model.safetensors.index.json";
constexpr const char* kSingleFile = "model.safetensors";
constexpr int64_t kScaleBlock = 128;  // DeepSeek-V3's FP8 weights carry one scale per 128x128 block
constexpr uint64_t kProgressMinBytes = uint64_t{1} << 30;

// Below this many elements, waking the thread pool costs more than it saves.
constexpr int64_t kParallelMinElements = int64_t{1} << 16;

void ForRange(int64_t n, int64_t elements_per_item, const std::function<void(int64_t, int64_t)>& fn) {
  if (n * elements_per_item < kParallelMinElements) {
    fn(0, n);
  } else {
    ParallelFor(n, fn);
  }
}

// Mapped tensor data has no alignment guarantee, so every element is read through memcpy.
template <typename T>
T ReadUnaligned(const uint8_t* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}

float ReadAsF32(const uint8_t* p, DType dtype) {
  switch (dtype) {
    case DType::kF32: return ReadUnaligned<float>(p);
    case DType::kBF16: return Bf16ToF32(bf16{ReadUnaligned<uint16_t>(p)});
    case DType::kF16: return F16ToF32(ReadUnaligned<uint16_t>(p));
    case DType::kF8E4M3:  // needs its block scales: DequantizeFp8
    case DType::kI8:
    case DType::kI32: break;
  }
  MOE_CHECK(false, "no float conversion from %s", std::string(DTypeName(dtype)).c_str());
  return 0.0f;
}

void Store(float v, float* dst) { *dst = v; }
void Store(float v, bf16* dst) { *dst = F32ToBf16(v); }

// Element-wise conversion of a tensor of dtype kSrc into `out` (F32 or BF16).
template <typename Out, DType kSrc>
void ConvertTyped(const uint8_t* src, Tensor& out) {
  Out* dst = out.data<Out>();
  const size_t src_size = DTypeSize(kSrc);
  ForRange(out.numel(), 1, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) Store(ReadAsF32(src + i * src_size, kSrc), dst + i);
  });
}

template <typename Out>
void Convert(const uint8_t* src, DType src_dtype, Tensor& out) {
  switch (src_dtype) {
    case DType::kF32: return ConvertTyped<Out, DType::kF32>(src, out);
    case DType::kBF16: return ConvertTyped<Out, DType::kBF16>(src, out);
    case DType::kF16: return ConvertTyped<Out, DType::kF16>(src, out);
    case DType::kF8E4M3:
    case DType::kI8:
    case DType::kI32: break;
  }
  MOE_CHECK(false, "no float conversion from %s", std::string(DTypeName(src_dtype)).c_str());
}

// Dequantizes a [rows, cols] F8_E4M3 weight: value = fp8 * scales[r / 128][c / 128].
template <typename Out>
void DequantizeFp8(const uint8_t* src, const std::vector<float>& scales, Tensor& out) {
  static const std::array<float, 256> kFp8 = [] {
    std::array<float, 256> table{};
    for (int i = 0; i < 256; ++i) table[i] = F8E4M3ToF32(static_cast<uint8_t>(i));
    return table;
  }();
  const int64_t rows = out.dim(0);
  const int64_t cols = out.dim(1);
  const int64_t scale_cols = (cols + kScaleBlock - 1) / kScaleBlock;
  Out* dst = out.data<Out>();
  ForRange(rows, cols, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const float* row_scales = scales.data() + (r / kScaleBlock) * scale_cols;
      for (int64_t c = 0; c < cols; ++c) {
        Store(kFp8[src[r * cols + c]] * row_scales[c / kScaleBlock], dst + r * cols + c);
      }
    }
  });
}

bool IsFloat(DType dtype) {
  return dtype == DType::kF32 || dtype == DType::kBF16 || dtype == DType::kF16 || dtype == DType::kF8E4M3;
}

Expected<std::string> ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return Status::Error(path + ": cannot open: " + std::strerror(errno));
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad()) return Status::Error(path + ": read error");
  return text.str();
}

// The weight_map of model.safetensors.index.json: tensor name -> shard file name.
Expected<std::map<std::string, std::string>> ReadWeightMap(const std::string& path) {
  MOE_ASSIGN_OR_RETURN(const std::string text, ReadFile(path));
  json root;
  try {
    root = json::parse(text);
  } catch (const json::exception& e) {
    const std::string what = e.what();  // drops nlohmann's "[json.exception...] " prefix
    return Status::Error(path + ": invalid JSON: " + what.substr(what.find("] ") + 2));
  }
  const auto it = root.is_object() ? root.find("weight_map") : root.end();
  if (it == root.end() || !it->is_object()) return Status::Error(path + ": no 'weight_map' object");
  std::map<std::string, std::string> weight_map;
  for (const auto& [tensor, shard] : it->items()) {
    if (!shard.is_string() || shard.get_ref<const std::string&>().empty()) {
      return Status::Error(path + ": weight_map entry '" + tensor + "' must be a shard file name");
    }
    weight_map[tensor] = shard.get<std::string>();
  }
  return weight_map;
}

}  // namespace

struct Checkpoint::Impl {
  std::string dir;
  std::vector<std::unique_ptr<SafetensorsFile>> files;
  std::map<std::string, const SafetensorsFile*> tensors;  // name -> the file that holds it

  // Loading progress, logged every 10% for big checkpoints: Load() is called once per tensor, so
  // counting there gives the caller progress for free.
  uint64_t total_bytes = 0;
  uint64_t loaded_bytes = 0;
  int logged_tenths = 0;

  void AddTensor(const std::string& name, const SafetensorsFile* file) {
    tensors[name] = file;
    const SafetensorsEntry* entry = file->Find(name);
    total_bytes += entry->end - entry->begin;
  }

  void CountLoaded(uint64_t bytes) {
    loaded_bytes += bytes;
    if (total_bytes < kProgressMinBytes) return;
    const int tenths = static_cast<int>(std::min<uint64_t>(10, loaded_bytes * 10 / total_bytes));
    if (tenths <= logged_tenths) return;
    logged_tenths = tenths;
    constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;
    spdlog::info("loading {}: {}% ({:.1f} of {:.1f} GiB)", dir, tenths * 10, loaded_bytes / kGiB,
                 total_bytes / kGiB);
  }
};

Checkpoint::Checkpoint() : impl_(std::make_unique<Impl>()) {}
Checkpoint::Checkpoint(Checkpoint&&) noexcept = default;
Checkpoint& Checkpoint::operator=(Checkpoint&&) noexcept = default;
Checkpoint::~Checkpoint() = default;

Expected<Checkpoint> Checkpoint::Open(const std::string& dir) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!fs::exists(dir, ec)) return Status::Error(dir + ": no such directory");
  if (!fs::is_directory(dir, ec)) return Status::Error(dir + ": not a directory");

  Checkpoint checkpoint;
  Impl& impl = *checkpoint.impl_;
  impl.dir = dir;
  const fs::path index_path = fs::path(dir) / kIndexFile;
  const fs::path single_path = fs::path(dir) / kSingleFile;
  if (fs::exists(index_path, ec)) {
    MOE_ASSIGN_OR_RETURN(const auto weight_map, ReadWeightMap(index_path.string()));
    std::map<std::string, const SafetensorsFile*> shards;
    for (const auto& [tensor, shard] : weight_map) {
      const SafetensorsFile*& file = shards[shard];
      if (file == nullptr) {
        MOE_ASSIGN_OR_RETURN(auto opened, SafetensorsFile::Open((fs::path(dir) / shard).string()));
        file = opened.get();
        impl.files.push_back(std::move(opened));
      }
      if (file->Find(tensor) == nullptr) {
        return Status::Error(index_path.string() + ": tensor '" + tensor + "' is mapped to '" + shard +
                             "', which does not contain it");
      }
      impl.AddTensor(tensor, file);
    }
  } else if (fs::exists(single_path, ec)) {
    MOE_ASSIGN_OR_RETURN(auto opened, SafetensorsFile::Open(single_path.string()));
    for (const auto& [name, entry] : opened->header().tensors) impl.AddTensor(name, opened.get());
    impl.files.push_back(std::move(opened));
  } else {
    return Status::Error(dir + ": no checkpoint: neither " + kIndexFile + " nor " + kSingleFile + " found");
  }
  return checkpoint;
}

bool Checkpoint::Has(const std::string& name) const { return impl_->tensors.count(name) != 0; }

std::vector<std::string> Checkpoint::TensorNames() const {
  std::vector<std::string> names;
  names.reserve(impl_->tensors.size());
  for (const auto& [name, file] : impl_->tensors) names.push_back(name);
  return names;
}

Expected<Tensor> Checkpoint::Load(const std::string& name, const Shape& shape, DType dtype) const {
  const auto it = impl_->tensors.find(name);
  if (it == impl_->tensors.end()) return Status::Error(impl_->dir + ": missing tensor '" + name + "'");
  const SafetensorsFile& file = *it->second;
  const SafetensorsEntry& entry = *file.Find(name);
  const std::string where = file.path() + ": tensor '" + name + "'";
  if (entry.shape != shape) {
    return Status::Error(where + ": shape " + ShapeToString(entry.shape) + ", expected " +
                         ShapeToString(shape));
  }

  Tensor out(dtype, shape);
  if (entry.dtype == dtype) {
    std::memcpy(out.raw(), file.Data(entry), out.nbytes());
    impl_->CountLoaded(out.nbytes());
    return out;
  }
  MOE_CHECK(dtype == DType::kF32 || dtype == DType::kBF16, "Load converts only to F32 or BF16, not %s",
            std::string(DTypeName(dtype)).c_str());
  if (!IsFloat(entry.dtype)) {
    return Status::Error(where + ": dtype " + std::string(DTypeName(entry.dtype)) +
                         " cannot be converted to " + std::string(DTypeName(dtype)));
  }
  if (entry.dtype != DType::kF8E4M3) {
    if (dtype == DType::kF32) {
      Convert<float>(file.Data(entry), entry.dtype, out);
    } else {
      Convert<bf16>(file.Data(entry), entry.dtype, out);
    }
    impl_->CountLoaded(entry.end - entry.begin);
    return out;
  }

  if (shape.size() != 2) {
    return Status::Error(where + ": F8_E4M3 tensor of shape " + ShapeToString(shape) +
                         " must be 2-D to use 128x128 block scales");
  }
  const std::string scale_name = name + "_scale_inv";
  const auto scale_it = impl_->tensors.find(scale_name);
  if (scale_it == impl_->tensors.end()) {
    return Status::Error(impl_->dir + ": missing tensor '" + scale_name +
                         "' (the block scales of F8_E4M3 tensor '" + name + "')");
  }
  const SafetensorsFile& scale_file = *scale_it->second;
  const SafetensorsEntry& scale_entry = *scale_file.Find(scale_name);
  const std::string scale_where = scale_file.path() + ": tensor '" + scale_name + "'";
  const Shape scale_shape = {(shape[0] + kScaleBlock - 1) / kScaleBlock,
                             (shape[1] + kScaleBlock - 1) / kScaleBlock};
  if (scale_entry.shape != scale_shape) {
    return Status::Error(scale_where + ": shape " + ShapeToString(scale_entry.shape) + ", expected " +
                         ShapeToString(scale_shape) + " (128x128 blocks of '" + name + "' " +
                         ShapeToString(shape) + ")");
  }
  if (scale_entry.dtype != DType::kF32 && scale_entry.dtype != DType::kBF16) {
    return Status::Error(scale_where + ": dtype " + std::string(DTypeName(scale_entry.dtype)) +
                         ", expected F32 or BF16");
  }
  std::vector<float> scales(NumElements(scale_shape));
  const size_t scale_size = DTypeSize(scale_entry.dtype);
  for (size_t i = 0; i < scales.size(); ++i) {
    scales[i] = ReadAsF32(scale_file.Data(scale_entry) + i * scale_size, scale_entry.dtype);
  }
  if (dtype == DType::kF32) {
    DequantizeFp8<float>(file.Data(entry), scales, out);
  } else {
    DequantizeFp8<bf16>(file.Data(entry), scales, out);
  }
  impl_->CountLoaded((entry.end - entry.begin) + (scale_entry.end - scale_entry.begin));
  return out;
}

}  // namespace moe
