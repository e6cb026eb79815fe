// kjit._C: the Python face of the runtime. Tensors never cross this boundary: ops are called
// through torch.ops, and RawKernel takes data pointers, so the module links no torch_python.
#include <kjit/kjit.hpp>

#include "entry_points.hpp"
#include "spec_export.hpp"
#include "torch/ops.hpp"

#include "runtime/cuda/nvrtc.hpp"

#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <pybind11/stl/filesystem.h>

#include <optional>

#include <fmt/format.h>

#include <climits>
#include <cstring>
#include <map>
#include <mutex>

namespace py = pybind11;

namespace {

// Raises the Python class `name` of kjit._errors with `message` and `attributes`.
void raise(const char* name, const char* message, const py::dict& attributes = {}) {
  py::object cls = py::module_::import("kjit._errors").attr(name);
  py::object error = cls(message);
  for (const auto& [key, value] : attributes) {
    py::setattr(error, key, value);
  }
  PyErr_SetObject(cls.ptr(), error.ptr());
}

void translate(std::exception_ptr p) {
  try {
    std::rethrow_exception(p);
  } catch (const kjit::CompileError& e) {
    py::dict a;
    a["log"] = e.log();
    a["options"] = e.options();
    a["arch"] = e.arch();
    a["program_name"] = e.program_name();
    a["result_name"] = e.result_name();
    raise("CompileError", e.what(), a);
  } catch (const kjit::ManifestError& e) {
    py::dict a;
    a["file"] = e.file();
    a["location"] = e.location();
    a["line"] = e.line();
    a["column"] = e.column();
    raise("ManifestError", e.what(), a);
  } catch (const kjit::LaunchError& e) {
    raise("LaunchError", e.what());
  } catch (const kjit::DriverError& e) {
    py::dict a;
    a["code"] = e.code();
    a["code_name"] = e.code_name();
    raise("DriverError", e.what(), a);
  } catch (const kjit::CacheError& e) {
    raise("CacheError", e.what());
  } catch (const kjit::NvrtcError& e) {
    raise("NvrtcError", e.what());
  } catch (const kjit::Error& e) {
    raise("Error", e.what());
  }
}

py::dict stats_dict(const kjit::CacheStats& s) {
  py::dict d;
  d["memory_hits"] = s.memory_hits;
  d["memory_misses"] = s.memory_misses;
  d["store_hits"] = s.store_hits;
  d["store_misses"] = s.store_misses;
  d["compiles"] = s.compiles;
  d["compile_ms"] = s.compile_ms;
  d["corrupt"] = s.corrupt;
  d["evictions"] = s.evictions;
  d["entries"] = s.entries;
  d["size_bytes"] = s.size_bytes;
  return d;
}

// A loaded package, for registering its ops' CUDA kernels once Python has defined the schemas.
struct PackageHandle {
  kjit::Package package;
};

// Loads the package at `path` and describes it and its ops (with every expression, for the
// Python half of the torch layer). `ns` is the op namespace (the package's name unless given).
// Registers nothing.
py::dict load_package(const std::filesystem::path& path, std::optional<std::string> ns) {
  kjit::Package package = kjit::Package::load(path);
  kjit::torch_layer::check_package(package);
  const std::string op_namespace = ns.value_or(package.name());
  py::dict info;
  info["name"] = package.name();
  info["namespace"] = op_namespace;
  info["version"] = package.version();
  info["description"] = package.description();
  info["dir"] = package.dir().string();
  info["manifest"] = package.manifest().string();
  py::list ops;
  for (std::size_t i = 0; i < package.ops().size(); ++i) {
    const auto& op = package.ops()[i];
    py::dict o = kjit::python::export_op(*package.op_specs()[i]);
    o["name"] = op.name;
    o["schema"] = op.schema;
    o["doc"] = op.doc;
    o["cpu"] = op.cpu;
    ops.append(o);
  }
  info["ops"] = ops;
  // No warm list here: a load does not need it, and it reads a program per item (50-100 ms for
  // norm's 183); `warm_list` gives it.
  info["handle"] = PackageHandle{std::move(package)};
  return info;
}

// A kernel from source, launched by hand with data pointers and scalars.
class RawKernel {
public:
  RawKernel(std::string source, std::string name, std::vector<std::string> options,
            std::vector<std::filesystem::path> include_dirs, std::vector<std::string> expressions)
    : m_program(
        name + ".cu", std::move(source),
        kjit::CompileOptions{std::move(options), std::move(include_dirs), std::move(expressions)}),
      m_name(std::move(name)) {}

  // Compiles (or fetches) for the current device and returns the parameter sizes.
  std::vector<std::size_t> prepare() {
    const kjit::Kernel k = kernel();
    return {k.param_sizes().begin(), k.param_sizes().end()};
  }

  // `kinds[i]` is 'p' (pointer), 'i' (integer), 'f' (float) or 'b' (bool); `values[i]` its value.
  void launch(std::vector<unsigned> grid, std::vector<unsigned> block, const std::string& kinds,
              const std::vector<py::object>& values, std::uintptr_t stream,
              std::size_t shared_mem) {
    if (grid.empty() || grid.size() > 3 || block.empty() || block.size() > 3) {
      throw kjit::LaunchError("grid and block take 1 to 3 dimensions");
    }
    const kjit::Kernel k = kernel();
    const auto params = k.param_sizes();
    if (!params.empty() && params.size() != kinds.size()) {
      throw kjit::LaunchError(fmt::format("kernel '{}' takes {} arguments, {} given", m_name,
                                          params.size(), kinds.size()));
    }
    std::vector<std::uint64_t> slots(kinds.size());
    std::vector<void*> pointers(kinds.size());
    std::vector<std::size_t> sizes(kinds.size());
    for (std::size_t i = 0; i < kinds.size(); ++i) {
      const std::size_t want = params.empty() ? 0 : params[i];
      auto mismatch = [&](const char* what) {
        return kjit::LaunchError(fmt::format("kernel '{}': parameter {} is {} bytes, which does "
                                             "not fit a {} argument",
                                             m_name, i, want, what));
      };
      switch (kinds[i]) {
      case 'p': {
        if (want != 0 && want != 8) {
          throw mismatch("tensor (pointer)");
        }
        slots[i] = values[i].cast<std::uint64_t>();
        sizes[i] = 8;
        break;
      }
      case 'i': {
        const auto v = values[i].cast<long long>();
        if (want == 8) {
          std::memcpy(&slots[i], &v, 8);
          sizes[i] = 8;
        } else if (want == 4 || want == 0) {
          if (v < INT32_MIN || v > UINT32_MAX) {
            throw kjit::LaunchError(
              fmt::format("kernel '{}': argument {} is {}, which does not fit its 32-bit parameter",
                          m_name, i, v));
          }
          const auto narrow = static_cast<std::uint32_t>(v);
          std::memcpy(&slots[i], &narrow, 4);
          sizes[i] = 4;
        } else {
          throw mismatch("int");
        }
        break;
      }
      case 'f': {
        const auto v = values[i].cast<double>();
        if (want == 8) {
          std::memcpy(&slots[i], &v, 8);
          sizes[i] = 8;
        } else if (want == 4 || want == 0) {
          const auto narrow = static_cast<float>(v);
          std::memcpy(&slots[i], &narrow, 4);
          sizes[i] = 4;
        } else {
          throw mismatch("float");
        }
        break;
      }
      case 'b': {
        if (want != 0 && want != 1) {
          throw mismatch("bool");
        }
        const bool v = values[i].cast<bool>();
        std::memcpy(&slots[i], &v, 1);
        sizes[i] = 1;
        break;
      }
      default:
        throw kjit::LaunchError(
          fmt::format("kernel '{}': argument {} has an unknown kind", m_name, i));
      }
      pointers[i] = &slots[i];
    }
    kjit::Dim3 g;
    kjit::Dim3 b;
    g.x = grid[0];
    g.y = grid.size() > 1 ? grid[1] : 1;
    g.z = grid.size() > 2 ? grid[2] : 1;
    b.x = block[0];
    b.y = block.size() > 1 ? block[1] : 1;
    b.z = block.size() > 2 ? block[2] : 1;
    py::gil_scoped_release release;
    k.launch_packed(g, b, shared_mem, reinterpret_cast<kjit::StreamHandle>(stream), pointers,
                    sizes);
  }

  // Compiles for `arch` without a GPU (through the cache); returns the binary's size.
  std::size_t compile(const std::string& arch) {
    py::gil_scoped_release release;
    return kjit::torch_layer::runtime()
      .compile(m_program, kjit::Target{kjit::Arch::parse(arch)})
      .data.size();
  }

  const std::string& name() const { return m_name; }

private:
  kjit::Kernel kernel() {
    std::lock_guard lock(m_mutex);
    // One kernel per device arch is memoized by the runtime; this skips its key computation.
    const kjit::Target target = kjit::torch_layer::runtime().default_target();
    auto it = m_kernels.find(target.name());
    if (it == m_kernels.end()) {
      it = m_kernels.emplace(target.name(), kjit::torch_layer::runtime().kernel(m_program, m_name))
             .first;
    }
    return it->second;
  }

  kjit::Program m_program;
  std::string m_name;
  std::mutex m_mutex;
  std::map<std::string, kjit::Kernel> m_kernels;
};

} // namespace

PYBIND11_MODULE(_C, m) {
  m.doc() = "kjit's runtime: kernel packages as torch ops, raw kernels, the kernel cache";
  py::register_exception_translator(&translate);

  m.def("version", [] { return std::string(kjit::version()); });
  m.def("nvrtc_version", &kjit::nvrtc_version);
  m.def("set_python_paths", &kjit::detail::set_python_paths, py::arg("paths"));
  m.def("nvrtc_info", [] {
    const kjit::NvrtcInfo info = kjit::nvrtc_info();
    py::dict d;
    d["found"] = info.found;
    d["library"] = info.library;
    d["how"] = info.how;
    d["version"] = py::make_tuple(info.major, info.minor);
    d["include_dirs"] = info.include_dirs;
    d["searched"] = info.searched;
    d["error"] = info.error;
    return d;
  });
  py::class_<PackageHandle>(m, "PackageHandle");
  m.def("_evaluate_expr", &kjit::python::evaluate_expr, py::arg("text"), py::arg("names"),
        py::arg("values"), "Tests only: an int expression exported and evaluated in C++.");
  m.def("entry_point_files", &kjit::python::entry_point_files, py::arg("dirs"), py::arg("group"),
        "(folder, text) of every distribution's metadata folder in `dirs`; text is its "
        "entry_points.txt when that names [group], else empty.");
  m.def("load_package", &load_package, py::arg("path"), py::arg("namespace") = py::none());
  m.def(
    "warm_list",
    [](const std::filesystem::path& path) {
      py::list warm;
      for (const auto& item : kjit::Package::load(path).warm_list()) {
        warm.append(py::make_tuple(item.op, item.kernel));
      }
      return warm;
    },
    py::arg("path"), "The (op, kernel) pairs `kjit warm` compiles for one arch.");
  m.def(
    "warm_gaps",
    [](const std::filesystem::path& path) {
      py::list gaps;
      for (const auto& gap : kjit::Package::load(path).warm_gaps()) {
        gaps.append(py::make_tuple(gap.op, gap.kernel, gap.needs, gap.fix));
      }
      return gaps;
    },
    py::arg("path"), "The (op, kernel, placeholders, fix) that the warm list leaves out.");
  m.def("attach_torch", &kjit::torch_layer::attach, py::arg("libtorch_cpu"),
        py::arg("libtorch_cuda"),
        "Resolves torch's stable C ABI from the libraries `import torch` loaded (Note [Stable ABI "
        "table]).");
  m.def(
    "register_cuda",
    [](const PackageHandle& handle, const std::string& ns) {
      py::gil_scoped_release release; // registration takes the dispatcher's locks
      kjit::torch_layer::register_cuda(handle.package, ns);
    },
    py::arg("package"), py::arg("namespace"),
    "Registers the CUDA kernels of the package's ops (their schemas defined).");
  m.def(
    "package_identity",
    [](const std::filesystem::path& path) {
      const kjit::Package package = kjit::Package::load(path);
      return std::make_pair(package.name(), package.version());
    },
    py::arg("path"), "The name and version of the package at `path`; raises ManifestError.");
  m.def(
    "add_read_only_cache",
    [](const std::filesystem::path& path, const std::string& scope) {
      return kjit::torch_layer::runtime().cache().add_read_only_path(path, scope);
    },
    py::arg("path"), py::arg("scope") = std::string(),
    "Adds a read-only store; with `scope` (an op namespace) it serves only that package.");
  m.def("set_tune_mode", &kjit::torch_layer::set_tune_mode, py::arg("namespace"), py::arg("op"),
        py::arg("mode"), py::arg("values") = std::vector<std::int64_t>{},
        "How the op's CUDA kernel picks its tune parameters: 'tuned', 'default' or 'fixed' "
        "(Note [Tuning]).");
  m.def("forget_tuned", &kjit::torch_layer::forget_tuned, py::arg("namespace"), py::arg("op"),
        "Forgets the tuned configurations this process holds for the op (the store keeps them).");
  m.def("tuned_entries", [] {
    py::list out;
    for (const auto& e : kjit::torch_layer::runtime().cache().tuned_entries()) {
      py::dict d;
      d["key"] = e.key;
      d["op"] = e.op;
      d["bucket"] = e.bucket;
      d["device"] = e.device;
      d["names"] = e.config.names;
      d["best"] = e.config.best;
      py::list timings;
      for (const auto& t : e.config.timings) {
        timings.append(py::make_tuple(t.values, t.ms, t.error));
      }
      d["timings"] = timings;
      d["pruned"] = e.config.pruned;
      d["budget_exhausted"] = e.config.budget_exhausted;
      d["seconds"] = e.config.seconds;
      d["created"] = e.created;
      d["store"] = e.store;
      out.append(d);
    }
    return out;
  });
  m.def("reserved_namespaces", &kjit::reserved_namespaces);
  m.def("cache_info", [] {
    kjit::Runtime& rt = kjit::torch_layer::runtime();
    py::dict info;
    info["enabled"] = rt.cache().enabled();
    info["read_only"] = rt.cache().read_only();
    info["path"] = rt.cache().path().string();
    info["process"] = stats_dict(rt.stats());
    info["store"] = stats_dict(rt.cache().stats());
    return info;
  });
  m.def("driver_available", &kjit::driver_available);
  m.def(
    "flush_remote", [] { kjit::torch_layer::runtime().flush_remote(); },
    py::call_guard<py::gil_scoped_release>(),
    "Waits (at most 2 s) for queued writes to the remote cache; run at exit.");
  m.def("device_count", &kjit::device_count);

  py::class_<RawKernel>(m, "RawKernel")
    .def(py::init<std::string, std::string, std::vector<std::string>,
                  std::vector<std::filesystem::path>, std::vector<std::string>>(),
         py::arg("source"), py::arg("name"), py::arg("options"), py::arg("include_dirs"),
         py::arg("name_expressions"))
    .def("prepare", &RawKernel::prepare)
    .def("compile", &RawKernel::compile, py::arg("arch"))
    .def("launch", &RawKernel::launch, py::arg("grid"), py::arg("block"), py::arg("kinds"),
         py::arg("values"), py::arg("stream"), py::arg("shared_mem"))
    .def_property_readonly("name", &RawKernel::name);
}
