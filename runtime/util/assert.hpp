// Assertions for bugs in kjit itself (never for user or environment errors, which throw
// `kjit::Error`). KJIT_ASSERT stays on in release builds; KJIT_DEBUG_ASSERT does not.
#pragma once

namespace kjit::detail {

[[noreturn]] void assertion_failed(const char* expression, const char* file, int line,
                                   const char* function) noexcept;

} // namespace kjit::detail

#define KJIT_ASSERT(expression)                                                                    \
  ((expression) ? static_cast<void>(0)                                                             \
                : ::kjit::detail::assertion_failed(#expression, __FILE__, __LINE__, __func__))

#ifdef NDEBUG
#  define KJIT_DEBUG_ASSERT(expression) static_cast<void>(0)
#else
#  define KJIT_DEBUG_ASSERT(expression) KJIT_ASSERT(expression)
#endif
