#pragma once
// Reading and writing the safetensors format, memory-mapped.
//
// A file is an 8-byte little-endian header length N, N bytes of JSON mapping
// tensor names to {dtype, shape, data_offsets}, then the raw data. Readers map
// the file read-only and hand out views into the mapping: loading a model
// copies no weight bytes (the GPU upload is the one copy).

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "model/dtype.hpp"

namespace metronome {

/// A read-only memory mapping of a whole file; movable, unmaps on destruction.
class mapped_file {
public:
  mapped_file() = default;
  /// Maps `path`; throws model_error naming the file when it cannot.
  explicit mapped_file(const std::filesystem::path& path);
  mapped_file(mapped_file&& other) noexcept;
  mapped_file& operator=(mapped_file&& other) noexcept;
  mapped_file(const mapped_file&) = delete;
  mapped_file& operator=(const mapped_file&) = delete;
  ~mapped_file();

  const std::byte* data() const noexcept {
    return data_;
  }

  size_t size() const noexcept {
    return size_;
  }

private:
  const std::byte* data_ = nullptr;
  size_t size_ = 0;
};

/// One tensor inside a mapped file. Valid while its tensor_store lives.
struct tensor_view {
  std::string name;
  dtype type = dtype::f32;
  std::vector<int64_t> shape;
  const std::byte* data = nullptr;
  size_t nbytes = 0;
  /// The file that holds it, for error messages.
  std::string file;

  int64_t numel() const {
    int64_t n = 1;
    for (auto d : shape)
      n *= d;
    return n;
  }

  /// Shape as "[a, b]".
  std::string shape_string() const;
};

/// The tensors of one safetensors file held in memory (`bytes` is the whole
/// file; `file` names it in errors), in header order; their data points into
/// `bytes`. Throws model_error naming the file and tensor on a malformed or
/// truncated header, data past the end, a size not matching shape and dtype,
/// or an unsupported dtype. Pure; tensor_store reads every file through it.
std::vector<tensor_view> parse_safetensors(std::span<const std::byte> bytes,
                                           const std::string& file);

/// All tensors of one model folder: a single model.safetensors, or shards
/// listed by model.safetensors.index.json.
class tensor_store {
public:
  /// Opens the weights of a Hugging Face folder. Throws model_error naming the
  /// file and tensor on: no weights, malformed or truncated header, data past
  /// the end of a file, size not matching shape and dtype, unsupported dtype,
  /// a tensor the index names but its shard lacks, or a duplicate tensor.
  static tensor_store open_folder(const std::filesystem::path& dir);

  /// Opens one safetensors file.
  static tensor_store open_file(const std::filesystem::path& file);

  /// The tensor called `name`, or nullptr.
  const tensor_view* find(const std::string& name) const;

  /// All tensors by name.
  const std::map<std::string, tensor_view>& tensors() const {
    return tensors_;
  }

  /// The files mapped, in the order opened.
  std::vector<std::string> files() const;

  /// Total bytes of tensor data.
  size_t total_bytes() const;

private:
  void add_file(const std::filesystem::path& file);

  std::vector<std::shared_ptr<mapped_file>> maps_;
  std::vector<std::string> paths_;
  std::map<std::string, tensor_view> tensors_;
};

/// Writes a safetensors file by streaming each tensor's bytes from a
/// generator; the header (sorted names, "__metadata__": {"format": "pt"}) is
/// deterministic, so equal inputs give byte-identical files.
class safetensors_writer {
public:
  /// Fills `out` (the tensor's bytes, in chunks) given the element offset.
  using fill_fn = std::function<void(size_t first_element, std::span<std::byte> out)>;

  /// Declares a tensor; its bytes are produced by `fill` at write time.
  void add(std::string name, dtype type, std::vector<int64_t> shape, fill_fn fill);

  /// Writes all declared tensors to `path`; throws model_error on I/O errors.
  void write(const std::filesystem::path& path) const;

  /// Bytes of tensor data declared so far.
  size_t data_bytes() const;

  /// Names declared so far.
  std::vector<std::string> names() const;

private:
  struct entry {
    std::string name;
    dtype type;
    std::vector<int64_t> shape;
    fill_fn fill;
  };
  std::vector<entry> entries_;
};

} // namespace metronome
