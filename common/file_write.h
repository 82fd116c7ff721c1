// Writing output files (traces, JSON reports, metrics): every failure is a DataError naming the
// file and the OS's reason ("No space left on device"), with a hint. Invariant: a function here
// that returns has handed every byte to the OS and closed (or flushed) without an error.
#pragma once

#include <ostream>
#include <string>
#include <string_view>

namespace ferry {

// Creates or truncates `path` and writes `text` to it, then closes it. Throws DataError
// "cannot write PATH: REASON" with `hint` (a generic one when empty).
void write_file(const std::string& path, std::string_view text, const std::string& hint = {});

// Flushes `out`, a stream writing `path`, and throws the same DataError when it has failed (a
// write, the flush, or an earlier operation). `errno` is read at once for the reason.
void check_stream(std::ostream& out, const std::string& path, const std::string& hint = {});

// Flushes stdout and throws DataError "cannot write standard output: REASON" when any write to
// it failed (a full disk or a closed pipe behind a redirection).
void check_stdout(const std::string& hint = {});

}  // namespace ferry
