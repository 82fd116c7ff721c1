// Reading a whole dataset file into memory. Invariant: the buffer is sized from the file's
// real size on disk, never from a header inside it, so a corrupt header cannot cause a huge
// allocation.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace ferry::data_detail {

// The bytes of `path`. DataError "cannot open <what> '<path>': <reason>" with `hint` when it
// cannot be opened or read, and DataError before allocating when it holds more than
// `max_bytes`.
std::vector<uint8_t> read_file(const std::string& path, const std::string& what,
                               const std::string& hint, uint64_t max_bytes = UINT64_MAX);
// At most the first `n` bytes of `path` (fewer when it is shorter); errors as read_file.
std::vector<uint8_t> read_file_head(const std::string& path, size_t n, const std::string& what,
                                    const std::string& hint);

// True when the bytes start with the gzip magic (1f 8b).
bool is_gzip(const std::vector<uint8_t>& bytes);

}  // namespace ferry::data_detail
