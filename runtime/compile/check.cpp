// kjit::check_package: compiles each (op, launch, specialization) of a package and checks the
// launch's arguments against the kernel's parameters read from the cubin, by the rules the
// torch layer packs them with (python_bindings/torch/ops.cpp, OpState::pack): a tensor is a
// pointer (8 bytes), an int 4 or 8 bytes, a float 4 or 8, a bool 1.
#include <kjit/check.hpp>
#include <kjit/error.hpp>

#include "runtime/compile/cubin.hpp"
#include "runtime/manifest/op_spec.hpp"

#include <fmt/format.h>

#include <algorithm>

namespace kjit {

namespace {

using detail::Kind;

// What is wrong with passing an argument of `kind` to a parameter of `size` bytes ("" if fine).
std::string mismatch(Kind kind, std::size_t size) {
  switch (kind) {
  case Kind::tensor:
    return size == 8 ? "" : "a tensor (a pointer, 8 bytes)";
  case Kind::int_:
    return size == 4 || size == 8 ? "" : "an int (packed as 4 or 8 bytes)";
  case Kind::float_:
    return size == 4 || size == 8 ? "" : "a float (packed as 4 or 8 bytes)";
  case Kind::bool_:
    return size == 1 ? "" : "a bool (1 byte)";
  default:
    return fmt::format("a {}, which is no kernel argument", detail::kind_name(kind));
  }
}

} // namespace

CheckReport check_package(Runtime& runtime, const Package& package,
                          const std::vector<Target>& targets) {
  CheckReport report;
  report.gaps = package.warm_gaps();
  const auto& specs = package.op_specs();
  const auto& ops = package.ops();
  for (const auto& item : package.warm_list(true)) {
    const auto op =
      std::find_if(ops.begin(), ops.end(), [&](const OpDecl& o) { return o.name == item.op; });
    const detail::OpSpec& spec = *specs[static_cast<std::size_t>(op - ops.begin())];
    const detail::LaunchSpec& launch = spec.launches[item.launch];
    const std::string where =
      spec.launches.size() > 1 ? fmt::format(" (launch {})", item.launch) : std::string();
    for (const auto& target : targets) {
      Binary binary;
      try {
        binary = runtime.compile(item.program, target);
      } catch (const Error& e) {
        report.problems.push_back({item.op, item.kernel, target.name(), e.what()});
        continue;
      }
      std::string mangled = item.kernel;
      for (const auto& [expression, lowered] : binary.lowered_names) {
        if (expression == item.kernel) {
          mangled = lowered;
        }
      }
      const auto params = detail::cubin_kernel_params(binary.data, mangled);
      if (!params) {
        ++report.unreadable;
        continue;
      }
      ++report.checked;
      if (params->size() != launch.args.size()) {
        report.problems.push_back(
          {item.op, item.kernel, target.name(),
           fmt::format("the manifest passes {} arguments{} but the kernel takes {}",
                       launch.args.size(), where, params->size())});
        continue;
      }
      for (std::size_t i = 0; i < params->size(); ++i) {
        const std::string wrong = mismatch(launch.args[i].kind(), (*params)[i].size);
        if (!wrong.empty()) {
          report.problems.push_back(
            {item.op, item.kernel, target.name(),
             fmt::format("argument {}{} ('{}') is {}, but the kernel's parameter {} is {} bytes", i,
                         where, launch.args[i].text(), wrong, i, (*params)[i].size)});
        }
      }
    }
  }
  return report;
}

} // namespace kjit
