// Byte sizes as users write them ("512MiB", "16GiB", "1.5GB", "4096") and as we print them.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace ferry {

// Parses a size: an integer or decimal number with an optional unit B, KiB, MiB, GiB, TiB
// (powers of 1024) or KB, MB, GB, TB (powers of 1000). nullopt when malformed or too large.
std::optional<uint64_t> parse_bytes(std::string_view text);

// "0 B", "512 B", "1.50 KiB", "12.00 GiB".
std::string format_bytes(uint64_t bytes);

}  // namespace ferry
