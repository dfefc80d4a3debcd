// libFuzzer target for the safetensors parser: any byte string either parses (and every tensor's
// bytes lie inside the buffer: touched here, checked by AddressSanitizer) or is a microscale::Error.
// Built with clang (-fsanitize=fuzzer,address,undefined) when available; ctest runs a short smoke
// run from the small seed corpus in tests/fuzz/safetensors_corpus.
#include <cstddef>
#include <cstdint>
#include <vector>

#include "microscale/error.hpp"
#include "microscale/safetensors.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::vector<std::byte> bytes(size);
  for (size_t i = 0; i < size; ++i) bytes[i] = static_cast<std::byte>(data[i]);
  try {
    const microscale::SafetensorsFile file = microscale::SafetensorsFile::from_bytes(std::move(bytes));
    unsigned sum = 0;
    for (const microscale::SafetensorsEntry& e : file.tensors()) {
      for (size_t j = 0; j < e.nbytes; ++j) sum += static_cast<unsigned>(e.data[j]);
      if (microscale::safetensors_to_dtype(e.dtype)) (void)file.view(e.name);
    }
    (void)sum;
  } catch (const microscale::Error&) {
  }
  return 0;
}
