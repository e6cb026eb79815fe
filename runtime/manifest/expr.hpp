// The small expression language of kernel manifests: checks, sizes, kernel arguments, launch
// geometry, workspaces and specializations.
//
//   image.dim() == 3 && image.size(2) == 3      cdiv(image.size(1), 32)
//   x.dtype == float16 || x.dtype == bfloat16   max(1, min(x.numel() / 256, 65535))
//   present(bias) ? bias.size(0) : 0            min(next_pow2(x.size(-1)), 1024)
//   aligned(x, 16) && x.size(-1) % 8 == 0 ? 8 : 1    device.sm_count * 2    dims[0] * len(dims)
//
// An expression is parsed once (errors give the column) into a flat node array and type-checked:
// every node has a kind (int, float, bool, dtype, tensor). Evaluation is a recursive walk, generic
// over the integer type, so the same expression gives concrete sizes for a launch and symbolic
// sizes (c10::SymInt) for a fake kernel.
#pragma once

#include <algorithm>
#include <cctype>
#include <climits>
#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

namespace kjit::detail {

// Tensor element types, numbered as c10::ScalarType (the torch layer checks that they agree).
enum class DType : std::int8_t {
  uint8 = 0,
  int8 = 1,
  int16 = 2,
  int32 = 3,
  int64 = 4,
  float16 = 5,
  float32 = 6,
  float64 = 7,
  bool_ = 11,
  bfloat16 = 15,
};

// "float16" for DType::float16; nullptr-free: unknown values give "unknown".
std::string_view dtype_name(DType dtype) noexcept;
// Parses "float16", "half", "bf16", "float", ...; false when not a dtype name.
bool parse_dtype(std::string_view name, DType& out) noexcept;
// The C++ type NVRTC code uses for `dtype` ("__half", "__nv_bfloat16", "float", ...).
std::string_view dtype_cpp_type(DType dtype) noexcept;

enum class Kind : std::uint8_t { int_, float_, bool_, dtype, tensor, int_list };
std::string_view kind_name(Kind kind) noexcept;

// A name an expression can use: an op argument, output or workspace, with its kind. An optional
// argument (`Tensor?`, `float?`) may be absent at a call: `present(name)` asks, and any other use
// of an absent one is an EvalError.
struct Symbol {
  std::string name;
  Kind kind;
  bool optional = false;
};

// What `device.NAME` reads of the device a call runs on (launch-time expressions only).
enum class DeviceProp : std::uint8_t {
  sm_count,       // multiprocessors
  max_shared_mem, // dynamic + static shared memory a block may opt in to, bytes
  cc,             // compute capability, major * 10 + minor (90 on an H100 or H200)
  warp_size,
};

// A parse or type error at `column` (1-based) of the expression text.
class ExprError : public std::runtime_error {
public:
  ExprError(std::size_t column, const std::string& message)
    : std::runtime_error(message), m_column(column) {}
  std::size_t column() const noexcept { return m_column; }

private:
  std::size_t m_column;
};

enum class NodeOp : std::uint8_t {
  int_literal,
  float_literal,
  bool_literal,
  dtype_literal,
  symbol, // leaves
  neg,
  not_, // unary
  add,
  sub,
  mul,
  div,
  mod,
  eq,
  ne,
  lt,
  le,
  gt,
  ge,
  and_,
  or_, // binary
  cdiv,
  min,
  max,
  gcd,
  next_pow2,
  present,
  aligned,
  len,
  select,      // cond ? b : c (a, b, c)
  item,        // list[index] (a: the list symbol, b: the index)
  device_prop, // functions
  size,
  stride,
  numel,
  dim,
  dtype_of,
  is_contiguous // tensor properties
};

struct Node {
  NodeOp op;
  Kind kind;
  std::int32_t a = -1;    // first operand, or the symbol index
  std::int32_t b = -1;    // second operand (for size/stride: the dimension expression)
  std::int64_t value = 0; // int/bool/dtype literal; a symbol's optional flag; a DeviceProp
  double number = 0;      // float literal
  std::uint32_t column = 0;
  std::int32_t c = -1; // third operand (select's false branch)
};

class Expr {
public:
  // Parses `text` with `symbols` (their index is their position); throws ExprError.
  static Expr parse(std::string_view text, const std::vector<Symbol>& symbols);

  Kind kind() const noexcept { return m_nodes[m_root].kind; }
  const std::string& text() const noexcept { return m_text; }
  const std::vector<Node>& nodes() const noexcept { return m_nodes; }
  std::int32_t root() const noexcept { return m_root; }
  // Whether a symbol of index `symbol` is used.
  bool uses(std::int32_t symbol) const noexcept;
  // Whether it reads what only a launch knows: `device.*` or a data pointer (`aligned`).
  bool uses_device() const noexcept;

private:
  std::string m_text;
  std::vector<Node> m_nodes;
  std::int32_t m_root = -1;
};

// An evaluation failed (division by zero, dimension out of range): `what()` says which.
class EvalError : public std::runtime_error {
public:
  using std::runtime_error::runtime_error;
};

// Evaluation against an environment `Env` with:
//   using Int = ...;                       // std::int64_t or c10::SymInt
//   Int size(int tensor, std::int64_t d) const;   Int stride(int tensor, std::int64_t d) const;
//   Int numel(int tensor) const;           std::int64_t dim(int tensor) const;
//   DType dtype(int tensor) const;         bool is_contiguous(int tensor) const;
//   Int int_value(int symbol) const;       double float_value(int symbol) const;
//   bool bool_value(int symbol) const;     bool present(int symbol) const;
//   Int list_item(int symbol, std::int64_t i) const;   std::int64_t list_len(int symbol) const;
//   bool aligned(int tensor, std::int64_t bytes) const; std::int64_t device_prop(DeviceProp) const;
//   static Int min(const Int&, const Int&); static Int max(const Int&, const Int&);
//   static bool truth(bool);                // the result of comparing two Ints
//   static std::optional<std::int64_t> concrete(const Int&);  // only when Int is symbolic
template <class Env>
class Evaluator {
public:
  using Int = typename Env::Int;
  Evaluator(const Expr& expr, const Env& env) : m_nodes(expr.nodes()), m_env(env), m_expr(expr) {}

  Int integer() const { return integer(m_expr.root()); }
  bool boolean() const { return boolean(m_expr.root()); }
  DType dtype() const { return dtype(m_expr.root()); }
  double number() const { return number(m_expr.root()); }

private:
  // The symbol of a leaf, checked present when it is optional.
  std::int32_t symbol(std::int32_t node) const {
    const Node& n = m_nodes[node];
    if (n.value != 0 && !m_env.present(n.a)) {
      throw EvalError("'" + symbol_text(n) + "' is None (an absent optional argument) in '" +
                      m_expr.text() + "': ask present(" + symbol_text(n) + ") first");
    }
    return n.a;
  }

  std::string symbol_text(const Node& n) const {
    const std::string& text = m_expr.text();
    std::size_t begin = n.column > 0 ? n.column - 1 : 0;
    std::size_t end = begin;
    while (end < text.size() &&
           (std::isalnum(static_cast<unsigned char>(text[end])) || text[end] == '_')) {
      ++end;
    }
    return text.substr(begin, end - begin);
  }

  static std::int64_t plain(const Int& v) {
    if constexpr (std::is_same_v<Int, std::int64_t>) {
      return v;
    } else {
      return v.guard_int(__FILE__, __LINE__);
    }
  }

  std::int64_t next_pow2(std::int64_t n) const {
    if (n > (std::int64_t(1) << 62)) {
      throw EvalError("integer overflow in next_pow2 in '" + m_expr.text() + "'");
    }
    std::int64_t p = 1;
    while (p < n) {
      p <<= 1;
    }
    return p;
  }

  std::int64_t gcd(std::int64_t a, std::int64_t b) const {
    if (a == INT64_MIN || b == INT64_MIN) {
      throw EvalError("integer overflow in gcd in '" + m_expr.text() + "'");
    }
    a = a < 0 ? -a : a;
    b = b < 0 ? -b : b;
    while (b != 0) {
      a = std::exchange(b, a % b);
    }
    return a;
  }

  std::int64_t dimension(std::int32_t tensor, std::int32_t node) const {
    const std::int64_t rank = m_env.dim(tensor);
    const Int raw = integer(node);
    std::int64_t d = 0;
    if constexpr (std::is_same_v<Int, std::int64_t>) {
      d = raw;
    } else {
      d = raw.guard_int(__FILE__, __LINE__);
    }
    const std::int64_t wrapped = d < 0 ? d + rank : d;
    if (wrapped < 0 || wrapped >= rank) {
      throw EvalError("dimension " + std::to_string(d) + " is out of range for a tensor of " +
                      std::to_string(rank) + " dimensions in '" + m_expr.text() + "'");
    }
    return wrapped;
  }

  // Concrete values are checked (overflow and division by zero are EvalErrors, never undefined
  // behaviour), also when they come as symbolic integers holding a plain value (meta tensors);
  // a symbolic divisor is guarded to be non-zero; the rest is left to c10::SymInt (exact).
  Int arithmetic(NodeOp op, const Int& a, const Int& b) const {
    if constexpr (std::is_same_v<Int, std::int64_t>) {
      return checked(op, a, b);
    } else {
      const auto ca = Env::concrete(a);
      const auto cb = Env::concrete(b);
      if (ca && cb) {
        return Int(checked(op, *ca, *cb));
      }
      switch (op) {
      case NodeOp::add:
        return a + b;
      case NodeOp::sub:
        return a - b;
      case NodeOp::mul:
        return a * b;
      default:
        break;
      }
      if (cb ? *cb == 0 : Env::truth(b == Int(0))) {
        throw EvalError("division by zero in '" + m_expr.text() + "'");
      }
      switch (op) {
      case NodeOp::div:
        return a / b;
      case NodeOp::mod:
        return a % b;
      default:
        return (a + b - Int(1)) / b;
      }
    }
  }

  std::int64_t checked(NodeOp op, std::int64_t a, std::int64_t b) const {
    {
      std::int64_t r = 0;
      bool overflow = false;
      if ((op == NodeOp::div || op == NodeOp::mod || op == NodeOp::cdiv) && b == 0) {
        throw EvalError("division by zero in '" + m_expr.text() + "'");
      }
      switch (op) {
      case NodeOp::add:
        overflow = __builtin_add_overflow(a, b, &r);
        break;
      case NodeOp::sub:
        overflow = __builtin_sub_overflow(a, b, &r);
        break;
      case NodeOp::mul:
        overflow = __builtin_mul_overflow(a, b, &r);
        break;
      default: // div, mod, cdiv
        overflow = a == INT64_MIN && b == -1;
        if (!overflow) {
          r = op == NodeOp::mod ? a % b : a / b;
          // Ceiling division rounds towards +infinity for any signs.
          if (op == NodeOp::cdiv && a % b != 0 && ((a < 0) == (b < 0))) {
            ++r;
          }
        }
        break;
      }
      if (overflow) {
        throw EvalError("integer overflow in '" + m_expr.text() + "'");
      }
      return r;
    }
  }

  Int integer(std::int32_t i) const {
    const Node& n = m_nodes[i];
    switch (n.op) {
    case NodeOp::int_literal:
      return Int(n.value);
    case NodeOp::symbol:
      return m_env.int_value(symbol(i));
    case NodeOp::neg:
      return arithmetic(NodeOp::sub, Int(0), integer(n.a));
    case NodeOp::select:
      return boolean(n.a) ? integer(n.b) : integer(n.c);
    case NodeOp::gcd:
      return Int(gcd(plain(integer(n.a)), plain(integer(n.b))));
    case NodeOp::next_pow2:
      return Int(next_pow2(plain(integer(n.a))));
    case NodeOp::len:
      return Int(m_env.list_len(symbol(n.a)));
    case NodeOp::item: {
      const std::int32_t list = symbol(n.a);
      const std::int64_t length = m_env.list_len(list);
      const std::int64_t raw = plain(integer(n.b));
      const std::int64_t index = raw < 0 ? raw + length : raw;
      if (index < 0 || index >= length) {
        throw EvalError("index " + std::to_string(raw) + " is out of range for a list of " +
                        std::to_string(length) + " in '" + m_expr.text() + "'");
      }
      return m_env.list_item(list, index);
    }
    case NodeOp::device_prop:
      return Int(m_env.device_prop(static_cast<DeviceProp>(n.value)));
    case NodeOp::add:
    case NodeOp::sub:
    case NodeOp::mul:
    case NodeOp::div:
    case NodeOp::mod:
    case NodeOp::cdiv:
      return arithmetic(n.op, integer(n.a), integer(n.b));
    case NodeOp::min:
      return Env::min(integer(n.a), integer(n.b));
    case NodeOp::max:
      return Env::max(integer(n.a), integer(n.b));
    case NodeOp::size: {
      const std::int32_t t = symbol(n.a);
      return m_env.size(t, dimension(t, n.b));
    }
    case NodeOp::stride: {
      const std::int32_t t = symbol(n.a);
      return m_env.stride(t, dimension(t, n.b));
    }
    case NodeOp::numel:
      return m_env.numel(symbol(n.a));
    case NodeOp::dim:
      return Int(m_env.dim(symbol(n.a)));
    default:
      break;
    }
    throw EvalError("internal: node is not an integer in '" + m_expr.text() + "'");
  }

  double number(std::int32_t i) const {
    const Node& n = m_nodes[i];
    if (n.kind == Kind::int_) {
      const Int v = integer(i);
      if constexpr (std::is_same_v<Int, std::int64_t>) {
        return static_cast<double>(v);
      } else {
        return static_cast<double>(v.guard_int(__FILE__, __LINE__));
      }
    }
    switch (n.op) {
    case NodeOp::float_literal:
      return n.number;
    case NodeOp::symbol:
      return m_env.float_value(symbol(i));
    case NodeOp::neg:
      return -number(n.a);
    case NodeOp::select:
      return boolean(n.a) ? number(n.b) : number(n.c);
    case NodeOp::add:
      return number(n.a) + number(n.b);
    case NodeOp::sub:
      return number(n.a) - number(n.b);
    case NodeOp::mul:
      return number(n.a) * number(n.b);
    case NodeOp::div:
      return number(n.a) / number(n.b);
    case NodeOp::min:
      return std::min(number(n.a), number(n.b));
    case NodeOp::max:
      return std::max(number(n.a), number(n.b));
    default:
      break;
    }
    throw EvalError("internal: node is not a number in '" + m_expr.text() + "'");
  }

  DType dtype(std::int32_t i) const {
    const Node& n = m_nodes[i];
    if (n.op == NodeOp::dtype_literal) {
      return static_cast<DType>(n.value);
    }
    if (n.op == NodeOp::dtype_of) {
      return m_env.dtype(symbol(n.a));
    }
    if (n.op == NodeOp::symbol) {
      return static_cast<DType>(m_env.int_value(symbol(i)));
    }
    if (n.op == NodeOp::select) {
      return boolean(n.a) ? dtype(n.b) : dtype(n.c);
    }
    throw EvalError("internal: node is not a dtype in '" + m_expr.text() + "'");
  }

  bool boolean(std::int32_t i) const {
    const Node& n = m_nodes[i];
    switch (n.op) {
    case NodeOp::bool_literal:
      return n.value != 0;
    case NodeOp::symbol:
      return m_env.bool_value(symbol(i));
    case NodeOp::select:
      return boolean(n.a) ? boolean(n.b) : boolean(n.c);
    case NodeOp::present:
      return m_env.present(m_nodes[n.a].a);
    case NodeOp::aligned: {
      const std::int64_t bytes = plain(integer(n.b));
      if (bytes <= 0) {
        throw EvalError("aligned() takes a positive number of bytes in '" + m_expr.text() + "'");
      }
      return m_env.aligned(symbol(n.a), bytes);
    }
    case NodeOp::not_:
      return !boolean(n.a);
    case NodeOp::and_:
      return boolean(n.a) && boolean(n.b);
    case NodeOp::or_:
      return boolean(n.a) || boolean(n.b);
    case NodeOp::is_contiguous:
      return m_env.is_contiguous(symbol(n.a));
    case NodeOp::eq:
    case NodeOp::ne:
    case NodeOp::lt:
    case NodeOp::le:
    case NodeOp::gt:
    case NodeOp::ge:
      return compare(n);
    default:
      break;
    }
    throw EvalError("internal: node is not a bool in '" + m_expr.text() + "'");
  }

  bool compare(const Node& n) const {
    const Kind operand = m_nodes[n.a].kind;
    if (operand == Kind::dtype || operand == Kind::bool_) {
      const auto a = operand == Kind::dtype ? static_cast<int>(dtype(n.a)) : int(boolean(n.a));
      const auto b = operand == Kind::dtype ? static_cast<int>(dtype(n.b)) : int(boolean(n.b));
      return n.op == NodeOp::eq ? a == b : a != b;
    }
    if (operand == Kind::float_ || m_nodes[n.b].kind == Kind::float_) {
      const double a = number(n.a);
      const double b = number(n.b);
      switch (n.op) {
      case NodeOp::eq:
        return a == b;
      case NodeOp::ne:
        return a != b;
      case NodeOp::lt:
        return a < b;
      case NodeOp::le:
        return a <= b;
      case NodeOp::gt:
        return a > b;
      default:
        return a >= b;
      }
    }
    const Int a = integer(n.a);
    const Int b = integer(n.b);
    switch (n.op) {
    case NodeOp::eq:
      return Env::truth(a == b);
    case NodeOp::ne:
      return Env::truth(a != b);
    case NodeOp::lt:
      return Env::truth(a < b);
    case NodeOp::le:
      return Env::truth(a <= b);
    case NodeOp::gt:
      return Env::truth(a > b);
    default:
      return Env::truth(a >= b);
    }
  }

  const std::vector<Node>& m_nodes;
  const Env& m_env;
  const Expr& m_expr;
};

} // namespace kjit::detail
