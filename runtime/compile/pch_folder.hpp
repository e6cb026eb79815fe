// The folder of a process's NVRTC precompiled headers, and the removal of the folders that
// killed processes left behind (Note [PCH folders] in pch_folder.cpp).
#pragma once

#include <cstddef>
#include <filesystem>
#include <string>

namespace kjit::detail {

// Where PCH folders are made: $TMPDIR, else /tmp (where NVRTC would put its own).
std::filesystem::path pch_base_dir();

// This process's PCH folder for `--pch-dir`, made at the first call (after removing the folders
// of processes that are gone) and removed at exit. Empty when none could be made: NVRTC's own
// folder is used then.
const std::string& pch_folder();

// Removes the PCH folders under `base` whose processes are gone; returns how many it removed.
std::size_t sweep_pch_folders(const std::filesystem::path& base);

} // namespace kjit::detail
