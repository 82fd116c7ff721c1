// Finding and pruning the step_<N>.safetensors files of a checkpoint folder.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace ferry {

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
