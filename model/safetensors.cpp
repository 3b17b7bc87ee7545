#include "model/safetensors.hpp"

#include <algorithm>
#include <cstring>
#include <fstream>

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include "model/model_error.hpp"

namespace metronome {

namespace fs = std::filesystem;
using nlohmann::json;

// -- mapped_file -----------------------------------------------------------------

mapped_file::mapped_file(const fs::path& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    throw model_error(path.string(), "", std::string("cannot open file: ") + std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    ::close(fd);
    throw model_error(path.string(), "", "cannot stat file");
  }
  size_ = static_cast<size_t>(st.st_size);
  if (size_ > 0) {
    void* p = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) {
      ::close(fd);
      throw model_error(path.string(), "", std::string("cannot map file: ") + std::strerror(errno));
    }
    data_ = static_cast<const std::byte*>(p);
  }
  ::close(fd);
}

mapped_file::mapped_file(mapped_file&& other) noexcept
  : data_(std::exchange(other.data_, nullptr)), size_(std::exchange(other.size_, 0)) {
  // nop
}

mapped_file& mapped_file::operator=(mapped_file&& other) noexcept {
  if (this != &other) {
    this->~mapped_file();
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
  }
  return *this;
}

mapped_file::~mapped_file() {
  if (data_)
    ::munmap(const_cast<std::byte*>(data_), size_);
}

// -- tensor_view -------------------------------------------------------------------

std::string tensor_view::shape_string() const {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i > 0)
      s += ", ";
    s += std::to_string(shape[i]);
  }
  return s + "]";
}

// -- tensor_store ------------------------------------------------------------------

namespace {

constexpr uint64_t max_header_bytes = 100u << 20; // as the reference implementation

uint64_t read_le64(const std::byte* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i)
    v = (v << 8) | std::to_integer<uint64_t>(p[i]);
  return v;
}

} // namespace

std::vector<tensor_view> parse_safetensors(std::span<const std::byte> bytes,
                                           const std::string& file) {
  if (bytes.size() < 8)
    throw model_error(file, "", "truncated file: shorter than the 8-byte header length");
  uint64_t header_len = read_le64(bytes.data());
  if (header_len > max_header_bytes)
    throw model_error(file, "", "malformed header: header length " + std::to_string(header_len)
                                  + " exceeds 100 MiB");
  if (header_len > bytes.size() - 8)
    throw model_error(file, "", "truncated file: header of " + std::to_string(header_len)
                                  + " bytes but only " + std::to_string(bytes.size() - 8)
                                  + " bytes follow the length");
  json header;
  try {
    auto* begin = reinterpret_cast<const char*>(bytes.data() + 8);
    header = json::parse(begin, begin + header_len);
  } catch (const json::exception& e) { // parse_error, or out_of_range for a number like 1e400
    throw model_error(file, "", std::string("malformed header: ") + e.what());
  }
  if (!header.is_object())
    throw model_error(file, "", "malformed header: expected a JSON object");
  const std::byte* data = bytes.data() + 8 + header_len;
  const size_t data_size = bytes.size() - 8 - header_len;
  std::vector<tensor_view> out;
  for (auto& [name, info] : header.items()) {
    if (name == "__metadata__")
      continue;
    auto fail = [&](const std::string& problem) -> void { throw model_error(file, name, problem); };
    if (!info.is_object() || !info.contains("dtype") || !info.contains("shape")
        || !info.contains("data_offsets"))
      fail("malformed header entry: needs dtype, shape and data_offsets");
    const auto& jt = info["dtype"];
    const auto& js = info["shape"];
    const auto& jo = info["data_offsets"];
    if (!jt.is_string())
      fail("malformed header entry: dtype must be a string");
    auto type = parse_dtype(jt.get<std::string>());
    if (!type)
      fail("unsupported dtype '" + jt.get<std::string>() + "' (supported: F32, F16, BF16, I32)");
    if (!js.is_array())
      fail("malformed header entry: shape must be an array");
    tensor_view view;
    view.name = name;
    view.type = *type;
    view.file = file;
    for (const auto& d : js) {
      if (!d.is_number_unsigned() && !(d.is_number_integer() && d.get<int64_t>() >= 0))
        fail("malformed header entry: shape must hold non-negative integers");
      view.shape.push_back(d.get<int64_t>());
    }
    if (!jo.is_array() || jo.size() != 2 || !jo[0].is_number_unsigned()
        || !jo[1].is_number_unsigned())
      fail("malformed header entry: data_offsets must be two non-negative integers");
    auto begin = jo[0].get<uint64_t>();
    auto end = jo[1].get<uint64_t>();
    if (end < begin)
      fail("malformed header entry: data_offsets end before they begin");
    if (end > data_size)
      fail("truncated file: data ends at byte " + std::to_string(end) + " of the data section but the file holds only "
           + std::to_string(data_size));
    view.nbytes = end - begin;
    // Checked: a shape whose element count overflows would wrap to a small
    // size that matches its data (and tensor_view::numel() would overflow).
    uint64_t bytes = dtype_size(view.type);
    for (auto d : view.shape)
      if (__builtin_mul_overflow(bytes, uint64_t(d), &bytes) || bytes > uint64_t(INT64_MAX))
        fail("size mismatch: shape " + view.shape_string() + " is larger than any file");
    if (view.nbytes != bytes)
      fail("size mismatch: " + std::to_string(view.nbytes) + " bytes for shape "
           + view.shape_string() + " of " + std::string(dtype_name(view.type)));
    view.data = data + begin;
    out.push_back(std::move(view));
  }
  return out;
}

void tensor_store::add_file(const fs::path& path) {
  auto map = std::make_shared<mapped_file>(path);
  const std::string file = path.string();
  for (auto& view : parse_safetensors({map->data(), map->size()}, file)) {
    if (auto it = tensors_.find(view.name); it != tensors_.end())
      throw model_error(file, view.name, "tensor appears twice (also in " + it->second.file + ")");
    auto name = view.name;
    tensors_.emplace(std::move(name), std::move(view));
  }
  maps_.push_back(std::move(map));
  paths_.push_back(file);
}

tensor_store tensor_store::open_file(const fs::path& file) {
  tensor_store store;
  store.add_file(file);
  return store;
}

tensor_store tensor_store::open_folder(const fs::path& dir) {
  tensor_store store;
  auto index = dir / "model.safetensors.index.json";
  auto single = dir / "model.safetensors";
  if (fs::exists(index)) {
    std::ifstream in(index);
    json doc;
    try {
      doc = json::parse(in);
    } catch (const json::exception& e) { // parse_error, or out_of_range for a number like 1e400
      throw model_error(index.string(), "", std::string("malformed JSON: ") + e.what());
    }
    if (!doc.is_object() || !doc.contains("weight_map") || !doc["weight_map"].is_object())
      throw model_error(index.string(), "weight_map", "missing or not an object");
    std::map<std::string, std::vector<std::string>> by_shard;
    for (auto& [name, shard] : doc["weight_map"].items()) {
      if (!shard.is_string())
        throw model_error(index.string(), "weight_map." + name, "expected a file name");
      auto shard_name = shard.get<std::string>();
      if (shard_name.find('/') != std::string::npos || shard_name.starts_with("."))
        throw model_error(index.string(), "weight_map." + name,
                          "shard '" + shard_name + "' must be a file in the model folder");
      by_shard[shard_name].push_back(name);
    }
    for (const auto& [shard, names] : by_shard) {
      auto path = dir / shard;
      if (!fs::exists(path))
        throw model_error(index.string(), "weight_map." + names.front(),
                          "shard '" + shard + "' does not exist");
      store.add_file(path);
      for (const auto& name : names)
        if (!store.tensors_.contains(name))
          throw model_error(path.string(), name, "listed in the index but missing from this shard");
    }
    return store;
  }
  if (fs::exists(single)) {
    store.add_file(single);
    return store;
  }
  throw model_error(dir.string(), "",
                    "no model.safetensors or model.safetensors.index.json in this folder");
}

const tensor_view* tensor_store::find(const std::string& name) const {
  auto i = tensors_.find(name);
  return i == tensors_.end() ? nullptr : &i->second;
}

std::vector<std::string> tensor_store::files() const {
  return paths_;
}

size_t tensor_store::total_bytes() const {
  size_t n = 0;
  for (const auto& [_, t] : tensors_)
    n += t.nbytes;
  return n;
}

// -- safetensors_writer ------------------------------------------------------------

void safetensors_writer::add(std::string name, dtype type, std::vector<int64_t> shape,
                             fill_fn fill) {
  entries_.push_back({std::move(name), type, std::move(shape), std::move(fill)});
}

size_t safetensors_writer::data_bytes() const {
  size_t n = 0;
  for (const auto& e : entries_) {
    size_t numel = 1;
    for (auto d : e.shape)
      numel *= size_t(d);
    n += numel * dtype_size(e.type);
  }
  return n;
}

std::vector<std::string> safetensors_writer::names() const {
  std::vector<std::string> out;
  for (const auto& e : entries_)
    out.push_back(e.name);
  return out;
}

void safetensors_writer::write(const fs::path& path) const {
  std::vector<const entry*> order;
  for (const auto& e : entries_)
    order.push_back(&e);
  std::sort(order.begin(), order.end(),
            [](const entry* a, const entry* b) { return a->name < b->name; });
  json header = json::object();
  header["__metadata__"] = {{"format", "pt"}};
  uint64_t offset = 0;
  std::vector<uint64_t> sizes;
  for (const auto* e : order) {
    uint64_t numel = 1;
    for (auto d : e->shape)
      numel *= uint64_t(d);
    uint64_t bytes = numel * dtype_size(e->type);
    header[e->name] = {{"dtype", std::string(dtype_name(e->type))},
                       {"shape", e->shape},
                       {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
    sizes.push_back(bytes);
  }
  std::string text = header.dump();
  while (text.size() % 8 != 0) // align the data section
    text.push_back(' ');
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out)
    throw model_error(path.string(), "", "cannot create file");
  char len[8];
  uint64_t n = text.size();
  for (int i = 0; i < 8; ++i)
    len[i] = static_cast<char>((n >> (8 * i)) & 0xff);
  out.write(len, 8);
  out.write(text.data(), std::streamsize(text.size()));
  constexpr size_t chunk = 32u << 20;
  std::vector<std::byte> buf;
  for (size_t k = 0; k < order.size(); ++k) {
    const auto* e = order[k];
    const size_t elem = dtype_size(e->type);
    for (uint64_t done = 0; done < sizes[k]; done += chunk) {
      size_t len_bytes = size_t(std::min<uint64_t>(chunk, sizes[k] - done));
      buf.resize(len_bytes);
      e->fill(size_t(done / elem), std::span<std::byte>(buf.data(), len_bytes));
      out.write(reinterpret_cast<const char*>(buf.data()), std::streamsize(len_bytes));
    }
  }
  out.flush();
  if (!out)
    throw model_error(path.string(), "", "write failed (disk full?)");
}

} // namespace metronome
