// Size parsing and printing.
#include "common/bytes.h"

#include <gtest/gtest.h>

namespace ferry {
namespace {

TEST(ParseBytes, AcceptsBinaryAndDecimalUnits) {
  EXPECT_EQ(parse_bytes("512MiB"), 512ull << 20);
  EXPECT_EQ(parse_bytes("16GiB"), 16ull << 30);
  EXPECT_EQ(parse_bytes("1.5GiB"), 3ull << 29);
  EXPECT_EQ(parse_bytes("2GB"), 2000000000ull);
  EXPECT_EQ(parse_bytes("4096"), 4096ull);
  EXPECT_EQ(parse_bytes(" 8 KiB "), 8192ull);
  EXPECT_EQ(parse_bytes("7B"), 7ull);
}

TEST(ParseBytes, RejectsMalformed) {
  EXPECT_FALSE(parse_bytes(""));
  EXPECT_FALSE(parse_bytes("GiB"));
  EXPECT_FALSE(parse_bytes("12 parsecs"));
  EXPECT_FALSE(parse_bytes("-1GiB"));
  EXPECT_FALSE(parse_bytes("1.2.3MiB"));
  EXPECT_FALSE(parse_bytes("0.3B"));
  EXPECT_FALSE(parse_bytes("99999999999TiB"));
}

TEST(FormatBytes, PicksTheLargestUnitBelow1024) {
  EXPECT_EQ(format_bytes(0), "0 B");
  EXPECT_EQ(format_bytes(1023), "1023 B");
  EXPECT_EQ(format_bytes(1536), "1.50 KiB");
  EXPECT_EQ(format_bytes(12ull << 30), "12.00 GiB");
}

}  // namespace
}  // namespace ferry
