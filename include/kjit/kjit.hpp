// kjit: a just-in-time CUDA kernel runtime. This header includes the whole public API.
//
// **Example**
//
//   #include <kjit/kjit.hpp>
//
//   kjit::Runtime runtime;
//   auto k = runtime.kernel(kjit::Program::from_file("img2gray.cu"), "img2gray_kernel");
//   k.launch({kjit::cdiv(w, 32), kjit::cdiv(h, 8)}, {32, 8}, 0, nullptr, in, out, w, h);
#pragma once

#include <kjit/arch.hpp>
#include <kjit/cache.hpp>
#include <kjit/check.hpp>
#include <kjit/device.hpp>
#include <kjit/error.hpp>
#include <kjit/kernel.hpp>
#include <kjit/log.hpp>
#include <kjit/package.hpp>
#include <kjit/program.hpp>
#include <kjit/runtime.hpp>
#include <kjit/warm.hpp>
