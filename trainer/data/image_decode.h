// Decoding JPEG (libjpeg-turbo's TurboJPEG API) and PNG (libpng) files into 8-bit RGB, as PIL's
// Image.open(...).convert("RGB") sees them. Invariant: every input gives a whole image or one
// DataError naming the file; no huge allocation from a corrupt header (Note [Decoding limits]).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

// Note [Decoding limits]
// Dimensions are checked against limits before any pixel buffer is allocated, so a corrupt
// header cannot cause a huge allocation.

namespace ferry {

// An 8-bit RGB image, rows top to bottom, pixels interleaved: (H, W, 3).
struct RgbImage {
  int width = 0;
  int height = 0;
  std::vector<uint8_t> pixels;  // (height, width, 3)
};

// What a decoder refuses before allocating.
struct DecodeLimits {
  // Width * height at most this (default 2^28: 16384 x 16384).
  int64_t max_pixels = int64_t{1} << 28;
  // Width * height at most this many pixels per byte of input, plus 2^20: a header that
  // claims far more pixels than the data could code is corrupt (deflate expands at most
  // 1032:1; a JPEG block costs at least a bit or two).
  int64_t max_pixels_per_byte = 2048;
  // Bytes of one image file at most (default 1 GiB: a 16384 x 16384 RGB PNG stored uncompressed
  // is 768 MiB); a larger file is refused before it is read.
  uint64_t max_file_bytes = uint64_t{1} << 30;
};

enum class ImageFormat { kUnknown, kJpeg, kPng };

// The format the first bytes announce (JPEG: FF D8 FF; PNG: its 8-byte signature).
ImageFormat sniff_image_format(const uint8_t* data, size_t size);

// Decodes a JPEG or PNG held in memory. `name` (the file) is quoted in errors:
// DataError "cannot decode image 'NAME': REASON". JPEG: greyscale is replicated to RGB, CMYK
// and YCCK (Adobe, inverted) are converted as PIL does; a truncated file is an error. PNG:
// palette, greyscale (1-16 bits), alpha (dropped, not composited) and 16-bit samples (the
// high byte) all become RGB8.
RgbImage decode_image(const uint8_t* data, size_t size, const std::string& name,
                      const DecodeLimits& limits = {});
RgbImage decode_jpeg(const uint8_t* data, size_t size, const std::string& name,
                     const DecodeLimits& limits = {});
RgbImage decode_png(const uint8_t* data, size_t size, const std::string& name,
                    const DecodeLimits& limits = {});

}  // namespace ferry
