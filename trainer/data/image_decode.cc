// JPEG and PNG decoding into RGB8. libpng reports errors by longjmp: every setjmp lives in a
// small function whose frame holds no C++ object with a destructor, so a longjmp never skips
// one; C++ buffers are allocated by the caller between those calls.
#include "trainer/data/image_decode.h"

#include <png.h>
#include <turbojpeg.h>

#include <algorithm>
#include <csetjmp>
#include <cstdio>
#include <cstring>

#include <fmt/format.h>

#include "common/error.h"
#include "common/strings.h"

namespace ferry {

namespace {

constexpr const char* kHint =
    "the file is not a readable JPEG or PNG image: replace or delete it, or set "
    "data.skip_bad=true to skip unreadable images";

[[noreturn]] void fail(const std::string& name, const std::string& reason) {
  throw DataError(fmt::format("cannot decode image '{}': {}", printable(name), reason), kHint);
}

void check_dimensions(int64_t width, int64_t height, size_t bytes, const std::string& name,
                      const DecodeLimits& limits) {
  if (width < 1 || height < 1) fail(name, fmt::format("it claims a {}x{} image", width, height));
  const int64_t pixels = width * height;
  if (pixels > limits.max_pixels) {
    fail(name, fmt::format("{}x{} pixels is more than the limit of {} pixels", width, height,
                           limits.max_pixels));
  }
  const int64_t plausible =
      limits.max_pixels_per_byte * static_cast<int64_t>(bytes) + (int64_t{1} << 20);
  if (pixels > plausible) {
    fail(name, fmt::format("it claims {}x{} pixels, far more than its {} bytes can hold "
                           "(corrupt header)",
                           width, height, bytes));
  }
}

// ---- JPEG ----

struct JpegFrame {
  int width = 0, height = 0, components = 0;
};

// The first frame header (SOF0..SOF15 less DHT, JPG, DAC) found by walking the marker
// segments; components == 0 when there is none before the first scan or the end of the data.
JpegFrame find_jpeg_frame(const uint8_t* d, size_t size) {
  JpegFrame frame;
  size_t pos = 2;  // after SOI
  while (pos + 4 <= size) {
    if (d[pos] != 0xFF) {  // garbage between segments: skip to the next marker
      ++pos;
      continue;
    }
    const uint8_t marker = d[pos + 1];
    if (marker == 0xFF) {  // fill byte
      ++pos;
      continue;
    }
    pos += 2;
    if (marker == 0x01 || (marker >= 0xD0 && marker <= 0xD7)) continue;  // no length
    if (marker == 0xD9 || marker == 0xDA) break;                         // EOI, SOS
    const size_t length = (size_t{d[pos]} << 8) | d[pos + 1];
    if (length < 2) break;
    const bool sof =
        marker >= 0xC0 && marker <= 0xCF && marker != 0xC4 && marker != 0xC8 && marker != 0xCC;
    if (sof) {
      if (pos + 8 > size || length < 8) break;
      frame.height = (d[pos + 3] << 8) | d[pos + 4];
      frame.width = (d[pos + 5] << 8) | d[pos + 6];
      frame.components = d[pos + 7];
      return frame;
    }
    pos += length;
  }
  return frame;
}

// Note [One decompressor per thread, discarded after any error]
// Each loader thread reuses one TurboJPEG decompressor. libjpeg keeps state in it between calls,
// and an error can leave that state mid-stream: the next file on the thread then fails with
// "two SOI markers" or "truncated file" although it is good. So a decode leases the thread's
// decompressor, and a lease that ends without a clean decode (an error, a warning, an exception)
// destroys it; the next decode on the thread makes a fresh one.
class DecompressorLease {
 public:
  DecompressorLease() {
    if (slot() == nullptr) slot() = tjInitDecompress();
    if (slot() == nullptr) throw Error("TurboJPEG: cannot create a decompressor (out of memory?)");
  }
  ~DecompressorLease() {
    if (clean_) return;
    tjDestroy(slot());
    slot() = nullptr;
  }
  DecompressorLease(const DecompressorLease&) = delete;
  DecompressorLease& operator=(const DecompressorLease&) = delete;

  tjhandle get() const { return slot(); }
  // Every call on the decompressor returned 0: it may serve the thread's next file.
  void clean() { clean_ = true; }

 private:
  struct Holder {
    tjhandle handle = nullptr;
    ~Holder() {
      if (handle != nullptr) tjDestroy(handle);
    }
  };
  static tjhandle& slot() {
    thread_local Holder holder;
    return holder.handle;
  }
  bool clean_ = false;
};

// PIL's CMYK -> RGB (R = (255 - K) - C * (255 - K) / 255, with its rounding), from the inverted
// (Adobe) values libjpeg returns: c' = 255 - C, k' = 255 - K.
inline uint8_t cmyk_channel(uint8_t inverted_c, uint8_t inverted_k) {
  const int c = 255 - inverted_c, nk = inverted_k;
  const int tmp = c * nk + 128;
  const int v = nk - (((tmp >> 8) + tmp) >> 8);
  return static_cast<uint8_t>(std::clamp(v, 0, 255));
}

}  // namespace

RgbImage decode_jpeg(const uint8_t* data, size_t size, const std::string& name,
                     const DecodeLimits& limits) {
  if (sniff_image_format(data, size) != ImageFormat::kJpeg) fail(name, "not a JPEG file");
  const JpegFrame frame = find_jpeg_frame(data, size);
  if (frame.components == 0) fail(name, "no JPEG frame header (truncated or corrupt file)");
  if (frame.components != 1 && frame.components != 3 && frame.components != 4) {
    fail(name, fmt::format("a JPEG with {} colour components is not supported", frame.components));
  }
  check_dimensions(frame.width, frame.height, size, name, limits);
  DecompressorLease lease;  // Note [One decompressor per thread, discarded after any error]
  tjhandle tj = lease.get();
  int width = 0, height = 0, subsampling = 0, colorspace = 0;
  unsigned char* buf = const_cast<unsigned char*>(data);
  const unsigned long len = static_cast<unsigned long>(size);
  bool warned = false;  // a call returned non-zero but the decode goes on
  if (tjDecompressHeader3(tj, buf, len, &width, &height, &subsampling, &colorspace) == 0) {
    // A header cut short before its scan reads as "tables only": no image size.
    if (width == 0 || height == 0) fail(name, "truncated file (the headers are incomplete)");
    if (width != frame.width || height != frame.height) {
      fail(name, fmt::format("inconsistent frame headers ({}x{} and {}x{})", frame.width,
                             frame.height, width, height));
    }
  } else if (std::strstr(tjGetErrorStr2(tj), "subsampling") == nullptr) {
    // TurboJPEG 2.1 refuses unusual sampling factors here though it decodes them.
    fail(name, tjGetErrorStr2(tj));
  } else {
    warned = true;
  }
  width = frame.width;
  height = frame.height;
  const bool cmyk = frame.components == 4;
  const int pixel_format = cmyk ? TJPF_CMYK : TJPF_RGB;
  const size_t channels = cmyk ? 4 : 3;
  RgbImage image;
  image.width = width;
  image.height = height;
  std::vector<uint8_t> decoded(static_cast<size_t>(width) * static_cast<size_t>(height) * channels);
  if (tjDecompress2(tj, buf, len, decoded.data(), width, static_cast<int>(width * channels), height,
                    pixel_format, TJFLAG_ACCURATEDCT | TJFLAG_LIMITSCANS) != 0) {
    warned = true;
    const std::string message = tjGetErrorStr2(tj);
    if (tjGetErrorCode(tj) != TJERR_WARNING) fail(name, message);
    // Warnings about corrupt entropy data still give an image (as in PIL); running out of
    // data does not.
    if (message.find("Premature end") != std::string::npos) {
      fail(name, "truncated file (" + message + ")");
    }
  }
  if (!warned) lease.clean();
  if (!cmyk) {
    image.pixels = std::move(decoded);
    return image;
  }
  image.pixels.resize(static_cast<size_t>(width) * static_cast<size_t>(height) * 3);
  const size_t n = static_cast<size_t>(width) * static_cast<size_t>(height);
  for (size_t i = 0; i < n; ++i) {
    const uint8_t* p = &decoded[i * 4];
    uint8_t* q = &image.pixels[i * 3];
    q[0] = cmyk_channel(p[0], p[3]);
    q[1] = cmyk_channel(p[1], p[3]);
    q[2] = cmyk_channel(p[2], p[3]);
  }
  return image;
}

// ---- PNG ----

namespace {

// Everything the libpng callbacks touch; trivially destructible (Note at the top).
struct PngReader {
  png_structp png = nullptr;
  png_infop info = nullptr;
  const uint8_t* data = nullptr;
  size_t size = 0;
  size_t pos = 0;
  char message[256] = {};
};

void png_on_error(png_structp png, png_const_charp message) {
  auto* r = static_cast<PngReader*>(png_get_error_ptr(png));
  std::snprintf(r->message, sizeof(r->message), "%s", message != nullptr ? message : "error");
  png_longjmp(png, 1);
}

void png_on_warning(png_structp, png_const_charp) {}

void png_on_read(png_structp png, png_bytep out, size_t n) {
  auto* r = static_cast<PngReader*>(png_get_io_ptr(png));
  if (n > r->size - r->pos) png_error(png, "the data ends early (truncated file)");
  std::memcpy(out, r->data + r->pos, n);
  r->pos += n;
}

struct PngHeader {
  png_uint_32 width = 0, height = 0;
  int bit_depth = 0, channels = 0;  // as stored
  size_t rowbytes = 0;              // after the transforms to RGB8
  int out_channels = 0;
};

// Reads the header and sets the transforms to RGB8. false (r->message set) on a libpng error.
bool png_start(PngReader* r, PngHeader* h) {
  if (setjmp(png_jmpbuf(r->png))) return false;
  png_set_user_limits(r->png, 1u << 24, 1u << 24);
  png_read_info(r->png, r->info);
  h->width = png_get_image_width(r->png, r->info);
  h->height = png_get_image_height(r->png, r->info);
  h->bit_depth = png_get_bit_depth(r->png, r->info);
  h->channels = png_get_channels(r->png, r->info);
  const int color = png_get_color_type(r->png, r->info);
  if (color == PNG_COLOR_TYPE_PALETTE) png_set_palette_to_rgb(r->png);
  if (color == PNG_COLOR_TYPE_GRAY && h->bit_depth < 8) png_set_expand_gray_1_2_4_to_8(r->png);
  if (h->bit_depth == 16) png_set_strip_16(r->png);
  if ((color & PNG_COLOR_MASK_ALPHA) || png_get_valid(r->png, r->info, PNG_INFO_tRNS)) {
    png_set_strip_alpha(r->png);
  }
  if (color == PNG_COLOR_TYPE_GRAY || color == PNG_COLOR_TYPE_GRAY_ALPHA) {
    png_set_gray_to_rgb(r->png);
  }
  png_set_interlace_handling(r->png);
  png_read_update_info(r->png, r->info);
  h->rowbytes = png_get_rowbytes(r->png, r->info);
  h->out_channels = png_get_channels(r->png, r->info);
  return true;
}

bool png_finish(PngReader* r, png_bytepp rows) {
  if (setjmp(png_jmpbuf(r->png))) return false;
  png_read_image(r->png, rows);
  png_read_end(r->png, nullptr);
  return true;
}

struct PngReaderGuard {
  PngReader* r;
  ~PngReaderGuard() { png_destroy_read_struct(&r->png, r->info ? &r->info : nullptr, nullptr); }
};

}  // namespace

RgbImage decode_png(const uint8_t* data, size_t size, const std::string& name,
                    const DecodeLimits& limits) {
  if (sniff_image_format(data, size) != ImageFormat::kPng) fail(name, "not a PNG file");
  PngReader r;
  r.data = data;
  r.size = size;
  r.png = png_create_read_struct(PNG_LIBPNG_VER_STRING, &r, png_on_error, png_on_warning);
  if (r.png == nullptr) throw Error("libpng: cannot create a reader (out of memory?)");
  PngReaderGuard guard{&r};
  r.info = png_create_info_struct(r.png);
  if (r.info == nullptr) throw Error("libpng: cannot create an info struct (out of memory?)");
  png_set_read_fn(r.png, &r, png_on_read);
  png_set_chunk_malloc_max(r.png, 8u << 20);

  PngHeader h;
  if (!png_start(&r, &h)) fail(name, r.message);
  check_dimensions(h.width, h.height, size, name, limits);
  // The inflated data (a filter byte and the samples of each row) cannot exceed 1032 times
  // the compressed bytes.
  const uint64_t raw_row = (uint64_t{h.width} * h.channels * h.bit_depth + 7) / 8 + 1;
  if (raw_row * h.height > 1100 * uint64_t{size} + (uint64_t{1} << 16)) {
    fail(name, fmt::format("it claims {}x{} pixels, far more than its {} bytes can hold "
                           "(corrupt header)",
                           h.width, h.height, size));
  }
  if (h.out_channels != 3 || h.rowbytes != size_t{h.width} * 3) {
    fail(name,
         fmt::format("unsupported PNG layout ({} channels of {} bits)", h.channels, h.bit_depth));
  }
  RgbImage image;
  image.width = static_cast<int>(h.width);
  image.height = static_cast<int>(h.height);
  image.pixels.resize(h.rowbytes * h.height);
  std::vector<png_bytep> rows(h.height);
  for (png_uint_32 y = 0; y < h.height; ++y) rows[y] = image.pixels.data() + y * h.rowbytes;
  if (!png_finish(&r, rows.data())) fail(name, r.message);
  return image;
}

ImageFormat sniff_image_format(const uint8_t* data, size_t size) {
  static constexpr uint8_t kPng[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1A, '\n'};
  if (size >= 3 && data[0] == 0xFF && data[1] == 0xD8 && data[2] == 0xFF) return ImageFormat::kJpeg;
  if (size >= 8 && std::memcmp(data, kPng, 8) == 0) return ImageFormat::kPng;
  return ImageFormat::kUnknown;
}

RgbImage decode_image(const uint8_t* data, size_t size, const std::string& name,
                      const DecodeLimits& limits) {
  switch (sniff_image_format(data, size)) {
    case ImageFormat::kJpeg:
      return decode_jpeg(data, size, name, limits);
    case ImageFormat::kPng:
      return decode_png(data, size, name, limits);
    case ImageFormat::kUnknown:
      break;
  }
  fail(name, size == 0 ? "the file is empty" : "neither a JPEG nor a PNG file (unknown signature)");
}

}  // namespace ferry
