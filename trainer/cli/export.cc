// `trainer export CHECKPOINT OUT_DIR`: a ferry checkpoint as a Hugging Face model folder
// (config.json + model.safetensors, and the tokenizer files the run knows) that transformers'
// from_pretrained loads; the folder loads back through model.init_from.
#include <cstdio>
#include <filesystem>

#include "trainer/checkpoint/hf_folder.h"
#include "trainer/cli/commands.h"
#include "trainer/config/config.h"
#include "trainer/config/model_folder.h"

namespace ferry {

namespace {

// The folder the run started from when it holds a tokenizer: the checkpoint's run (its
// config.yaml, two levels up under the default checkpoint.dir) read a model folder through
// model.init_from. "" when there is none, or the run's config is not there to say.
std::string run_tokenizer(const std::string& checkpoint) {
  namespace fs = std::filesystem;
  const fs::path config = fs::path(checkpoint).parent_path().parent_path() / "config.yaml";
  std::error_code ec;
  if (!fs::exists(config, ec)) return "";
  try {
    const Config c = load_config(config.string());
    if (is_model_folder(c.model.init_from) &&
        fs::exists(fs::path(c.model.init_from) / "tokenizer.json", ec)) {
      return c.model.init_from;
    }
  } catch (const Error&) {
    // A run dir whose config no longer loads (a moved folder): no tokenizer to take.
  }
  return "";
}

}  // namespace

int run_export(const ExportArgs& args) {
  std::string tokenizer = args.tokenizer;
  if (tokenizer.empty()) {
    tokenizer = run_tokenizer(args.checkpoint);
    if (!tokenizer.empty())
      std::printf("tokenizer: the run's model folder %s\n", tokenizer.c_str());
  }
  for (const std::string& path : export_model_folder(args.checkpoint, args.out_dir, tokenizer)) {
    std::printf("wrote %s\n", path.c_str());
  }
  return 0;
}

}  // namespace ferry
