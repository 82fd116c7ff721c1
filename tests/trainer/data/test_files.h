// Helpers for dataset tests: little binary file writers (and the shared per-test temporary
// folder, tests/support/temp_dir.h).
#pragma once

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "tests/support/temp_dir.h"
#include "trainer/data/token_file.h"

namespace ferry::testing {

inline void write_bytes(const std::string& path, const std::vector<uint8_t>& bytes) {
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(bytes.data()),
            static_cast<std::streamsize>(bytes.size()));
}

inline void append_be32(std::vector<uint8_t>& out, uint32_t v) {
  for (int shift = 24; shift >= 0; shift -= 8) out.push_back(static_cast<uint8_t>(v >> shift));
}

inline void put_le32(std::string& out, int32_t v) {
  for (int shift = 0; shift < 32; shift += 8)
    out.push_back(static_cast<char>((static_cast<uint32_t>(v) >> shift) & 0xff));
}

// uint16 tokens, little-endian: a nanoGPT file's bytes.
inline std::string u16_tokens(const std::vector<uint16_t>& tokens) {
  std::string out;
  for (uint16_t t : tokens) {
    out.push_back(static_cast<char>(t & 0xff));
    out.push_back(static_cast<char>(t >> 8));
  }
  return out;
}

// llm.c's token file layout: magic, version, count, then 253 zeros, then the tokens.
inline std::string llmc_file(const std::vector<uint16_t>& tokens, int32_t count = -1,
                             int32_t version = kLlmcTokensVersion,
                             int32_t magic = kLlmcTokensMagic) {
  std::string out;
  put_le32(out, magic);
  put_le32(out, version);
  put_le32(out, count >= 0 ? count : static_cast<int32_t>(tokens.size()));
  out.resize(kLlmcHeaderBytes, '\0');
  return out + u16_tokens(tokens);
}

// llm.c's uint32 token file layout (its "llama-3" format): magic 20240801, version 7, count,
// 253 zeros, then the tokens as little-endian uint32.
inline std::string llmc32_file(const std::vector<uint32_t>& tokens, int32_t count = -1,
                               int32_t version = kLlmcTokens32Version) {
  std::string out;
  put_le32(out, kLlmcTokens32Magic);
  put_le32(out, version);
  put_le32(out, count >= 0 ? count : static_cast<int32_t>(tokens.size()));
  out.resize(kLlmcHeaderBytes, '\0');
  for (uint32_t t : tokens) put_le32(out, static_cast<int32_t>(t));
  return out;
}

// The message of the exception E that `f` throws, or "" (test failure) when none.
template <typename E, typename F>
std::string error_of(F f) {
  try {
    f();
  } catch (const E& e) {
    return e.what();
  }
  ADD_FAILURE() << "no exception thrown";
  return "";
}

}  // namespace ferry::testing
