// libFuzzer target: the safetensors reader (parse_safetensors in
// model/safetensors.hpp, what tensor_store runs on every mapped file). Input:
// a whole file, 8-byte header length, JSON header, data. Properties: a
// malformed file is a model_error and nothing else; an accepted tensor lies
// inside the file and its byte count is its shape times its dtype's size.

#include <cstddef>
#include <cstdint>
#include <span>

#include "model/model_error.hpp"
#include "model/safetensors.hpp"
#include "tests/fuzz/fuzz_check.hpp"

using namespace metronome;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::span<const std::byte> file{reinterpret_cast<const std::byte*>(data), size};
  try {
    for (const auto& t : parse_safetensors(file, "fuzz.safetensors")) {
      FUZZ_CHECK(t.data >= file.data() && t.data + t.nbytes <= file.data() + file.size(),
                 "tensor data outside the file");
      uint64_t elements = 1;
      for (auto d : t.shape)
        elements *= uint64_t(d);
      FUZZ_CHECK(elements * dtype_size(t.type) == t.nbytes, "byte count does not match the shape");
    }
  } catch (const model_error&) {
    // The documented refusal.
  }
  return 0;
}
