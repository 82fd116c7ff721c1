// Prints a token file as ferry's loader reads it, for tests/scripts/prepare_tokens_test.py:
// "FORMAT COUNT", then every token on one line. With --scan VOCAB it times the whole-file
// vocabulary scan instead (the figure docs/data.md gives). Exit 2 with "error: ..." on a bad file.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "common/error.h"
#include "trainer/data/token_file.h"

int main(int argc, char** argv) {
  using ferry::TokenFile;
  const bool scan = argc == 4 && std::string(argv[1]) == "--scan";
  if (!(argc == 2 || scan)) {
    std::fprintf(stderr, "usage: token_dump FILE | token_dump --scan VOCAB FILE\n");
    return 2;
  }
  try {
    TokenFile file(argv[argc - 1]);
    if (scan) {
      const int64_t vocab = std::atoll(argv[2]);
      const auto start = std::chrono::steady_clock::now();
      const TokenFile::VocabScan s = file.scan(vocab);
      const double seconds =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      const double bytes = static_cast<double>(file.size()) * file.token_bytes();
      std::printf("%s: %lld tokens (%s), largest %u, first outside %lld: %.6f s, %.2f GB/s\n",
                  file.path().c_str(), static_cast<long long>(file.size()), file.format_name(),
                  s.largest, static_cast<long long>(s.first_outside), seconds,
                  bytes / seconds / 1e9);
      file.check_vocab(vocab);
      return 0;
    }
    std::vector<int32_t> tokens(static_cast<size_t>(file.size()));
    file.read(0, file.size(), int64_t{1} << 31, tokens.data());
    std::printf("%s %lld\n", file.format_name(), static_cast<long long>(file.size()));
    for (size_t i = 0; i < tokens.size(); ++i) std::printf(i ? " %d" : "%d", tokens[i]);
    std::printf("\n");
  } catch (const ferry::Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 2;
  }
  return 0;
}
