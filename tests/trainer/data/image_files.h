// Test helpers that write JPEG (TurboJPEG) and PNG (libpng) files in memory: colour, grey,
// CMYK, palette, alpha, 16-bit and interlaced variants, plus a deterministic test pattern.
#pragma once

#include <png.h>
#include <turbojpeg.h>

#include <csetjmp>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

namespace ferry::testing {

// A smooth colour pattern with some edges: (h, w, channels) interleaved.
inline std::vector<uint8_t> pattern(int w, int h, int channels, int seed = 0) {
  std::vector<uint8_t> out(static_cast<size_t>(w) * h * channels);
  for (int y = 0; y < h; ++y) {
    for (int x = 0; x < w; ++x) {
      for (int c = 0; c < channels; ++c) {
        int v = (x * (3 + c) + y * (5 - c) + seed * 37) % 256;
        if (((x / 7) + (y / 5) + c) % 3 == 0) v = 255 - v;
        out[(static_cast<size_t>(y) * w + x) * channels + c] = static_cast<uint8_t>(v);
      }
    }
  }
  return out;
}

// pixel_format: TJPF_RGB, TJPF_GRAY or TJPF_CMYK (-> a YCCK JPEG with an Adobe marker).
inline std::vector<uint8_t> encode_jpeg(const std::vector<uint8_t>& pixels, int w, int h,
                                        int pixel_format, int quality = 95,
                                        int subsampling = TJSAMP_420, bool progressive = false) {
  tjhandle tj = tjInitCompress();
  unsigned char* buf = nullptr;
  unsigned long size = 0;
  const int channels = tjPixelSize[pixel_format];
  if (pixel_format == TJPF_GRAY) subsampling = TJSAMP_GRAY;
  const int rc = tjCompress2(tj, pixels.data(), w, w * channels, h, pixel_format, &buf, &size,
                             subsampling, quality, progressive ? TJFLAG_PROGRESSIVE : 0);
  if (rc != 0) {
    const std::string message = tjGetErrorStr2(tj);
    tjDestroy(tj);
    throw std::runtime_error("tjCompress2: " + message);
  }
  std::vector<uint8_t> out(buf, buf + size);
  tjFree(buf);
  tjDestroy(tj);
  return out;
}

// A 16x16 colour JPEG whose SOF0 frame header is patched to claim height x width pixels.
inline std::vector<uint8_t> jpeg_claiming(int height, int width) {
  auto jpeg = encode_jpeg(pattern(16, 16, 3), 16, 16, TJPF_RGB);
  for (size_t i = 2; i + 9 < jpeg.size(); ++i) {
    if (jpeg[i] == 0xFF && jpeg[i + 1] == 0xC0) {
      jpeg[i + 5] = static_cast<uint8_t>(height >> 8), jpeg[i + 6] = static_cast<uint8_t>(height);
      jpeg[i + 7] = static_cast<uint8_t>(width >> 8), jpeg[i + 8] = static_cast<uint8_t>(width);
      return jpeg;
    }
  }
  throw std::runtime_error("jpeg_claiming: no SOF0 marker");
}

namespace detail {
inline void png_write_data(png_structp png, png_bytep data, size_t n) {
  auto* out = static_cast<std::vector<uint8_t>*>(png_get_io_ptr(png));
  out->insert(out->end(), data, data + n);
}
inline void png_flush(png_structp) {}
// libpng's longjmp target; no C++ object with a destructor lives in this frame.
inline bool png_write_all(png_structp png, png_infop info, int w, int h, int bit_depth,
                          int color_type, bool interlaced, png_bytepp rows,
                          const png_color* palette, int palette_size) {
  if (setjmp(png_jmpbuf(png))) return false;
  png_set_IHDR(png, info, w, h, bit_depth, color_type,
               interlaced ? PNG_INTERLACE_ADAM7 : PNG_INTERLACE_NONE, PNG_COMPRESSION_TYPE_DEFAULT,
               PNG_FILTER_TYPE_DEFAULT);
  if (palette != nullptr) png_set_PLTE(png, info, palette, palette_size);
  png_write_info(png, info);
  png_write_image(png, rows);
  png_write_end(png, nullptr);
  return true;
}
}  // namespace detail

// `samples` holds the rows as stored (16-bit samples big-endian, palette indices, packed bits).
inline std::vector<uint8_t> encode_png(const std::vector<uint8_t>& samples, int w, int h,
                                       int bit_depth, int color_type, bool interlaced = false,
                                       const std::vector<png_color>& palette = {}) {
  std::vector<uint8_t> out;
  png_structp png = png_create_write_struct(PNG_LIBPNG_VER_STRING, nullptr, nullptr, nullptr);
  png_infop info = png_create_info_struct(png);
  png_set_write_fn(png, &out, detail::png_write_data, detail::png_flush);
  const size_t row_bytes = samples.size() / static_cast<size_t>(h);
  std::vector<png_bytep> rows(h);
  for (int y = 0; y < h; ++y) rows[y] = const_cast<png_bytep>(samples.data() + y * row_bytes);
  const bool ok = detail::png_write_all(png, info, w, h, bit_depth, color_type, interlaced,
                                        rows.data(), palette.empty() ? nullptr : palette.data(),
                                        static_cast<int>(palette.size()));
  png_destroy_write_struct(&png, &info);
  if (!ok) throw std::runtime_error("libpng could not write the test image");
  return out;
}

}  // namespace ferry::testing
