// ferry's imagefolder loader throughput: images/s read, decoded, RandomResizedCrop'ed, flipped
// and normalised into batches by data.workers threads. Prints one JSON line for
// bench/imagefolder_vs_torchvision.py (Note [Imagefolder loader bench]).
#include <chrono>
#include <cstdio>
#include <memory>

#include <CLI/CLI.hpp>

#include "common/error.h"
#include "trainer/data/dataset.h"
#include "trainer/data/loader.h"

// Note [Imagefolder loader bench]
// bench/imagefolder_vs_torchvision.py measures torchvision's DataLoader in the same run. Usage:
//   bench_imagefolder_loader FOLDER [--workers 2] [--crop 224] [--batch 32] [--epochs 2]

int main(int argc, char** argv) {
  CLI::App app("imagefolder loader throughput");
  std::string folder;
  int workers = 2, crop = 224, batch = 32, epochs = 2;
  app.add_option("folder", folder, "ImageFolder-layout folder")->required();
  app.add_option("--workers", workers, "loader threads");
  app.add_option("--crop", crop, "RandomResizedCrop size");
  app.add_option("--batch", batch, "batch size");
  app.add_option("--epochs", epochs, "epochs timed after the first batch");
  CLI11_PARSE(app, argc, argv);
  try {
    ferry::ImageFolderOptions o;
    o.path = folder;
    o.crop_height = o.crop_width = crop;
    o.augment = true;
    std::shared_ptr<const ferry::Dataset> ds = ferry::load_imagefolder_dataset(o);
    ferry::LoaderOptions lo;
    lo.batch_size = batch;
    lo.workers = workers;
    lo.epochs = epochs + 1;
    lo.drop_last = false;
    lo.mean = {0.485f, 0.456f, 0.406f};
    lo.stddev = {0.229f, 0.224f, 0.225f};
    ferry::DataLoader loader(ds, lo);
    // The clock starts at the first batch, as for torchvision (whose workers need to start).
    ferry::Batch first = loader.next();
    first.release();
    const auto start = std::chrono::steady_clock::now();
    int64_t images = 0;
    double checksum = 0;
    while (ferry::Batch b = loader.next()) {
      images += b.size();
      checksum += b.images()[0];
    }
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    std::printf(
        "{\"images\": %lld, \"seconds\": %.4f, \"images_per_s\": %.2f, \"workers\": %d, "
        "\"checksum\": %.6f}\n",
        static_cast<long long>(images), seconds, images / seconds, workers, checksum);
    return 0;
  } catch (const ferry::Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 2;
  }
}
