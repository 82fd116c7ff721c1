// Writes what the imagefolder source gives for every sample of a folder with the evaluation
// transform, for the torchvision comparison (imagefolder_torchvision.py):
//   imagefolder_dump FOLDER RESIZE CROP OUT  ->  OUT.f32: (N, 3, CROP, CROP) float32 in [0, 1],
//   OUT.txt: one line per sample, "label".
#include <cstdio>
#include <fstream>
#include <vector>

#include "common/error.h"
#include "trainer/data/dataset.h"

int main(int argc, char** argv) {
  if (argc != 5) {
    std::fprintf(stderr, "usage: imagefolder_dump FOLDER RESIZE CROP OUT\n");
    return 2;
  }
  try {
    ferry::ImageFolderOptions o;
    o.path = argv[1];
    o.resize = std::stoll(argv[2]);
    o.crop_height = o.crop_width = std::stoll(argv[3]);
    o.augment = false;
    const auto ds = ferry::load_imagefolder_dataset(o);
    const size_t sample = static_cast<size_t>(3 * o.crop_height * o.crop_width);
    std::vector<float> pixels(sample);
    std::ofstream images(std::string(argv[4]) + ".f32", std::ios::binary);
    std::ofstream labels(std::string(argv[4]) + ".txt");
    for (int64_t i = 0; i < ds->size(); ++i) {
      labels << ds->get(i, pixels.data()) << "\n";
      images.write(reinterpret_cast<const char*>(pixels.data()),
                   static_cast<std::streamsize>(sample * sizeof(float)));
    }
    return images && labels ? 0 : 1;
  } catch (const ferry::Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 2;
  }
}
