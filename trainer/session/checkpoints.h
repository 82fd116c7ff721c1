// Finding and pruning the step_<N>.safetensors files of a checkpoint folder, and the run shape
// that resume checks.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "trainer/config/config.h"

namespace ferry {

// The run's shape as config key -> value text, recorded in each checkpoint and checked on
// resume (Note [What resume checks] in trainer/checkpoint/model_checkpoint.cc): model.name, and
// model.input and model.classes for an image model, or the resolved transformer sizes and
// data.seq_len (tokens per row) for a token model.
std::map<std::string, std::string> run_shape(const Config& config);

// "<dir>/step_<step>.safetensors".
std::string checkpoint_path(const std::string& dir, int64_t step);
// Checkpoints in `dir`, oldest first, as (step, path). Temporary files are ignored.
std::vector<std::pair<int64_t, std::string>> list_checkpoints(const std::string& dir);
// Deletes all but the newest `keep` (keep 0 keeps all).
void prune_checkpoints(const std::string& dir, int64_t keep);
// checkpoint.resume resolved: "" -> "", "latest" -> the newest in dir or "" when none,
// else the path itself (DataError when it does not exist).
std::string resolve_resume(const std::string& resume, const std::string& dir);

}  // namespace ferry
