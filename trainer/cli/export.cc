// `trainer export CHECKPOINT OUT_DIR`: a ferry checkpoint as a Hugging Face model folder
// (config.json + model.safetensors, and tokenizer files with --tokenizer) that transformers'
// from_pretrained loads; the folder loads back through model.init_from.
#include <cstdio>

#include "trainer/checkpoint/hf_folder.h"
#include "trainer/cli/commands.h"

namespace ferry {

int run_export(const ExportArgs& args) {
  for (const std::string& path :
       export_model_folder(args.checkpoint, args.out_dir, args.tokenizer)) {
    std::printf("wrote %s\n", path.c_str());
  }
  return 0;
}

}  // namespace ferry
