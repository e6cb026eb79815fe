// The expression language of manifests: its parser (tokens, precedence, the checks of kinds
// and symbols), which compiles an expression into the flat node list `Evaluator` runs.
#include "runtime/manifest/expr.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <limits>

namespace kjit::detail {
namespace {

enum class Token {
  end,
  number,
  ident,
  op,
  lparen,
  rparen,
  comma,
  dot,
  question,
  colon,
  lbracket,
  rbracket
};

class Parser {
public:
  Parser(std::string_view text, const std::vector<Symbol>& symbols, std::vector<Node>& nodes)
    : m_text(text), m_symbols(symbols), m_nodes(nodes) {
    next();
  }

  std::int32_t parse_all() {
    const std::int32_t root = parse_expr();
    if (m_token != Token::end) {
      fail(m_token_start, fmt::format("unexpected '{}'", m_token_text));
    }
    return root;
  }

private:
  [[noreturn]] void fail(std::size_t position, const std::string& message) const {
    throw ExprError(position + 1, message);
  }

  void next() {
    while (m_pos < m_text.size() && std::isspace(static_cast<unsigned char>(m_text[m_pos]))) {
      ++m_pos;
    }
    m_token_start = m_pos;
    if (m_pos >= m_text.size()) {
      m_token = Token::end;
      m_token_text = "end of expression";
      return;
    }
    const char c = m_text[m_pos];
    if (std::isdigit(static_cast<unsigned char>(c))) {
      std::size_t end = m_pos;
      while (end < m_text.size() &&
             (std::isalnum(static_cast<unsigned char>(m_text[end])) || m_text[end] == '.' ||
              ((m_text[end] == '-' || m_text[end] == '+') &&
               (m_text[end - 1] == 'e' || m_text[end - 1] == 'E')))) {
        ++end;
      }
      m_token = Token::number;
      m_token_text = m_text.substr(m_pos, end - m_pos);
      m_pos = end;
      return;
    }
    if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
      std::size_t end = m_pos;
      while (end < m_text.size() &&
             (std::isalnum(static_cast<unsigned char>(m_text[end])) || m_text[end] == '_')) {
        ++end;
      }
      m_token = Token::ident;
      m_token_text = m_text.substr(m_pos, end - m_pos);
      m_pos = end;
      return;
    }
    static constexpr std::string_view k_two[] = {"==", "!=", "<=", ">=", "&&", "||"};
    for (std::string_view op : k_two) {
      if (m_text.substr(m_pos, 2) == op) {
        m_token = Token::op;
        m_token_text = op;
        m_pos += 2;
        return;
      }
    }
    m_token_text = m_text.substr(m_pos, 1);
    ++m_pos;
    switch (c) {
    case '(':
      m_token = Token::lparen;
      return;
    case ')':
      m_token = Token::rparen;
      return;
    case ',':
      m_token = Token::comma;
      return;
    case '.':
      m_token = Token::dot;
      return;
    case '?':
      m_token = Token::question;
      return;
    case ':':
      m_token = Token::colon;
      return;
    case '[':
      m_token = Token::lbracket;
      return;
    case ']':
      m_token = Token::rbracket;
      return;
    case '+':
    case '-':
    case '*':
    case '/':
    case '%':
    case '<':
    case '>':
    case '!':
      m_token = Token::op;
      return;
    default:
      fail(m_token_start, fmt::format("unexpected character '{}'", c));
    }
  }

  void expect(Token token, std::string_view what) {
    if (m_token != token) {
      fail(m_token_start, fmt::format("expected {} but found '{}'", what, m_token_text));
    }
    next();
  }

  std::int32_t add(Node node) {
    m_nodes.push_back(node);
    return static_cast<std::int32_t>(m_nodes.size() - 1);
  }

  Kind kind(std::int32_t i) const { return m_nodes[i].kind; }

  static int precedence(std::string_view op) {
    if (op == "||")
      return 1;
    if (op == "&&")
      return 2;
    if (op == "==" || op == "!=")
      return 3;
    if (op == "<" || op == "<=" || op == ">" || op == ">=")
      return 4;
    if (op == "+" || op == "-")
      return 5;
    if (op == "*" || op == "/" || op == "%")
      return 6;
    return 0;
  }

  // Bounded recursion: a hostile manifest cannot exhaust the stack.
  struct Depth {
    Parser& parser;
    explicit Depth(Parser& p) : parser(p) {
      if (++parser.m_depth > k_max_depth) {
        parser.fail(parser.m_token_start,
                    fmt::format("expression nested deeper than {} levels", k_max_depth));
      }
    }
    ~Depth() { --parser.m_depth; }
    Depth(const Depth&) = delete;
    Depth& operator=(const Depth&) = delete;
  };

  // cond ? a : b, the loosest binding (right-associative); both branches of one kind (int and
  // float mix to float). Only the branch taken is evaluated.
  std::int32_t parse_expr() {
    const Depth depth(*this);
    const std::int32_t cond = parse_binary(0);
    if (m_token != Token::question) {
      return cond;
    }
    const std::size_t column = m_token_start;
    if (kind(cond) != Kind::bool_) {
      fail(column, fmt::format("'?' needs a bool condition, not {}", kind_name(kind(cond))));
    }
    next();
    const std::int32_t a = parse_expr();
    expect(Token::colon, "':' of 'cond ? a : b'");
    const std::int32_t b = parse_expr();
    const Kind ka = kind(a);
    const Kind kb = kind(b);
    const bool numeric =
      (ka == Kind::int_ || ka == Kind::float_) && (kb == Kind::int_ || kb == Kind::float_);
    if ((ka != kb && !numeric) || ka == Kind::tensor || ka == Kind::int_list) {
      fail(column, fmt::format("the branches of '?' are {} and {}: give both one kind",
                               kind_name(ka), kind_name(kb)));
    }
    Node node{NodeOp::select,
              numeric && ka != kb ? Kind::float_ : ka,
              cond,
              a,
              0,
              0,
              static_cast<std::uint32_t>(column + 1)};
    node.c = b;
    return add(node);
  }

  std::int32_t parse_binary(int min_precedence) {
    const Depth depth(*this);
    std::int32_t left = parse_unary();
    while (m_token == Token::op) {
      const std::string_view op = m_token_text;
      const int p = precedence(op);
      if (p == 0) {
        fail(m_token_start, fmt::format("'{}' is not a binary operator", op));
      }
      if (p < min_precedence) {
        break;
      }
      const std::size_t column = m_token_start;
      next();
      const std::int32_t right = parse_binary(p + 1);
      left = combine(op, left, right, column);
    }
    return left;
  }

  std::int32_t combine(std::string_view op, std::int32_t a, std::int32_t b, std::size_t column) {
    const Kind ka = kind(a);
    const Kind kb = kind(b);
    auto numeric = [](Kind k) { return k == Kind::int_ || k == Kind::float_; };
    Node node{};
    node.a = a;
    node.b = b;
    node.column = static_cast<std::uint32_t>(column + 1);
    auto mismatch = [&] {
      fail(column, fmt::format("'{}' cannot combine {} and {}", op, kind_name(ka), kind_name(kb)));
    };
    if (op == "&&" || op == "||") {
      if (ka != Kind::bool_ || kb != Kind::bool_) {
        mismatch();
      }
      node.op = op == "&&" ? NodeOp::and_ : NodeOp::or_;
      node.kind = Kind::bool_;
    } else if (op == "==" || op == "!=") {
      if (!(numeric(ka) && numeric(kb)) && ka != kb) {
        mismatch();
      }
      if (ka == Kind::tensor || ka == Kind::int_list) {
        mismatch();
      }
      node.op = op == "==" ? NodeOp::eq : NodeOp::ne;
      node.kind = Kind::bool_;
    } else if (op == "<" || op == "<=" || op == ">" || op == ">=") {
      if (!numeric(ka) || !numeric(kb)) {
        mismatch();
      }
      node.op = op == "<"    ? NodeOp::lt
                : op == "<=" ? NodeOp::le
                : op == ">"  ? NodeOp::gt
                             : NodeOp::ge;
      node.kind = Kind::bool_;
    } else {
      if (!numeric(ka) || !numeric(kb)) {
        mismatch();
      }
      node.kind = ka == Kind::float_ || kb == Kind::float_ ? Kind::float_ : Kind::int_;
      if (op == "%" && node.kind == Kind::float_) {
        mismatch();
      }
      node.op = op == "+"   ? NodeOp::add
                : op == "-" ? NodeOp::sub
                : op == "*" ? NodeOp::mul
                : op == "/" ? NodeOp::div
                            : NodeOp::mod;
    }
    return add(node);
  }

  std::int32_t parse_unary() {
    const Depth depth(*this);
    if (m_token == Token::op && (m_token_text == "-" || m_token_text == "!")) {
      const bool negate = m_token_text == "-";
      const std::size_t column = m_token_start;
      next();
      const std::int32_t operand = parse_unary();
      const Kind k = kind(operand);
      if (negate ? (k != Kind::int_ && k != Kind::float_) : k != Kind::bool_) {
        fail(column, fmt::format("'{}' cannot apply to {}", negate ? '-' : '!', kind_name(k)));
      }
      return add(Node{negate ? NodeOp::neg : NodeOp::not_, k, operand, -1, 0, 0,
                      static_cast<std::uint32_t>(column + 1)});
    }
    return parse_postfix();
  }

  std::int32_t parse_postfix() {
    std::int32_t value = parse_primary();
    if (m_token == Token::lbracket) {
      const std::size_t column = m_token_start;
      if (kind(value) != Kind::int_list) {
        fail(column, fmt::format("'[' indexes an int[] argument, not {}", kind_name(kind(value))));
      }
      next();
      const std::int32_t index = parse_expr();
      if (kind(index) != Kind::int_) {
        fail(column, "a list index is an int");
      }
      expect(Token::rbracket, "']'");
      value = add(
        Node{NodeOp::item, Kind::int_, value, index, 0, 0, static_cast<std::uint32_t>(column + 1)});
    }
    while (m_token == Token::dot) {
      next();
      if (m_token != Token::ident) {
        fail(m_token_start, "expected a property name after '.'");
      }
      const std::string_view property = m_token_text;
      const std::size_t column = m_token_start;
      next();
      if (kind(value) != Kind::tensor) {
        fail(column, fmt::format("'.{}' needs a tensor, not {}", property, kind_name(kind(value))));
      }
      Node node{};
      node.a = value;
      node.column = static_cast<std::uint32_t>(column + 1);
      if (property == "dtype") {
        node.op = NodeOp::dtype_of;
        node.kind = Kind::dtype;
        value = add(node);
        continue;
      }
      expect(Token::lparen, fmt::format("'(' after '{}'", property));
      if (property == "size" || property == "stride") {
        node.b = parse_expr();
        if (kind(node.b) != Kind::int_) {
          fail(column, fmt::format("'{}' takes an int dimension", property));
        }
        node.op = property == "size" ? NodeOp::size : NodeOp::stride;
        node.kind = Kind::int_;
      } else if (property == "numel" || property == "dim") {
        node.op = property == "numel" ? NodeOp::numel : NodeOp::dim;
        node.kind = Kind::int_;
      } else if (property == "is_contiguous") {
        node.op = NodeOp::is_contiguous;
        node.kind = Kind::bool_;
      } else {
        fail(column, fmt::format("unknown tensor property '{}' (known: size, stride, numel, dim, "
                                 "dtype, is_contiguous)",
                                 property));
      }
      expect(Token::rparen, "')'");
      value = add(node);
    }
    return value;
  }

  std::int32_t parse_primary() {
    const std::size_t column = m_token_start;
    const auto col = static_cast<std::uint32_t>(column + 1);
    if (m_token == Token::number) {
      const std::string_view text = m_token_text;
      next();
      Node node{};
      node.column = col;
      std::int64_t integer = 0;
      auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), integer);
      if (ec == std::errc() && end == text.data() + text.size()) {
        node.op = NodeOp::int_literal;
        node.kind = Kind::int_;
        node.value = integer;
        return add(node);
      }
      double number = 0;
      auto [fend, fec] = std::from_chars(text.data(), text.data() + text.size(), number);
      if (fec != std::errc() || fend != text.data() + text.size()) {
        fail(column, fmt::format("'{}' is not a number", text));
      }
      node.op = NodeOp::float_literal;
      node.kind = Kind::float_;
      node.number = number;
      return add(node);
    }
    if (m_token == Token::lparen) {
      next();
      const std::int32_t inner = parse_expr();
      expect(Token::rparen, "')'");
      return inner;
    }
    if (m_token != Token::ident) {
      fail(column, fmt::format("expected a value but found '{}'", m_token_text));
    }
    const std::string_view name = m_token_text;
    next();
    if (m_token == Token::lparen && name != "present" && name != "aligned" && name != "len" &&
        name != "next_pow2" && name != "gcd" && name != "cdiv" && name != "min" && name != "max" &&
        find_symbol(name) < 0) {
      fail(column, fmt::format("unknown function '{}' (known: cdiv, min, max, gcd, next_pow2, "
                               "present, aligned, len)",
                               name));
    }
    if (m_token == Token::lparen && find_symbol(name) < 0 &&
        (name == "present" || name == "aligned" || name == "len")) {
      next();
      const std::int32_t a = parse_primary();
      const Node& arg = m_nodes[a];
      Node node{};
      node.a = a;
      node.column = col;
      if (name == "present") {
        if (arg.op != NodeOp::symbol || arg.value == 0) {
          fail(column, "present() takes an optional argument (one declared with '?')");
        }
        node.op = NodeOp::present;
        node.kind = Kind::bool_;
      } else if (name == "len") {
        if (arg.op != NodeOp::symbol || arg.kind != Kind::int_list) {
          fail(column, "len() takes an int[] argument");
        }
        node.op = NodeOp::len;
        node.kind = Kind::int_;
      } else {
        if (arg.op != NodeOp::symbol || arg.kind != Kind::tensor) {
          fail(column, "aligned() takes a tensor argument and a number of bytes");
        }
        expect(Token::comma, "',' between the arguments of aligned");
        node.b = parse_expr();
        if (kind(node.b) != Kind::int_) {
          fail(column, "aligned() takes a tensor argument and a number of bytes");
        }
        node.op = NodeOp::aligned;
        node.kind = Kind::bool_;
      }
      expect(Token::rparen, "')'");
      return add(node);
    }
    if (m_token == Token::lparen && find_symbol(name) < 0 && name == "next_pow2") {
      next();
      const std::int32_t a = parse_expr();
      expect(Token::rparen, "')'");
      if (kind(a) != Kind::int_) {
        fail(column, "next_pow2() takes an int");
      }
      return add(Node{NodeOp::next_pow2, Kind::int_, a, -1, 0, 0, col});
    }
    if (m_token == Token::lparen && find_symbol(name) < 0 &&
        (name == "cdiv" || name == "min" || name == "max" || name == "gcd")) {
      next();
      const std::int32_t a = parse_expr();
      expect(Token::comma, fmt::format("',' between the arguments of {}", name));
      const std::int32_t b = parse_expr();
      expect(Token::rparen, "')'");
      const bool floats = kind(a) == Kind::float_ || kind(b) == Kind::float_;
      const bool int_only = name == "cdiv" || name == "gcd";
      if ((kind(a) != Kind::int_ && kind(a) != Kind::float_) ||
          (kind(b) != Kind::int_ && kind(b) != Kind::float_) || (int_only && floats)) {
        fail(column,
             fmt::format("{}() takes {} arguments", name, int_only ? "int" : "two int or float"));
      }
      return add(Node{name == "cdiv"  ? NodeOp::cdiv
                      : name == "gcd" ? NodeOp::gcd
                      : name == "min" ? NodeOp::min
                                      : NodeOp::max,
                      floats ? Kind::float_ : Kind::int_, a, b, 0, 0, col});
    }
    if (name == "true" || name == "false") {
      return add(Node{NodeOp::bool_literal, Kind::bool_, -1, -1, name == "true", 0, col});
    }
    if (const std::int32_t i = find_symbol(name); i >= 0) {
      return add(
        Node{NodeOp::symbol, m_symbols[i].kind, i, -1, m_symbols[i].optional ? 1 : 0, 0, col});
    }
    if (name == "device" && m_token == Token::dot) {
      next();
      const std::string_view property = m_token == Token::ident ? m_token_text : "";
      static constexpr std::pair<std::string_view, DeviceProp> k_props[] = {
        {"sm_count", DeviceProp::sm_count},
        {"max_shared_mem", DeviceProp::max_shared_mem},
        {"cc", DeviceProp::cc},
        {"warp_size", DeviceProp::warp_size},
      };
      for (const auto& [known, prop] : k_props) {
        if (property == known) {
          next();
          return add(
            Node{NodeOp::device_prop, Kind::int_, -1, -1, static_cast<std::int64_t>(prop), 0, col});
        }
      }
      fail(column, fmt::format("unknown device property '{}' (known: sm_count, max_shared_mem, "
                               "cc, warp_size)",
                               property));
    }
    DType dtype{};
    if (parse_dtype(name, dtype)) {
      return add(
        Node{NodeOp::dtype_literal, Kind::dtype, -1, -1, static_cast<std::int64_t>(dtype), 0, col});
    }
    std::string known;
    for (const auto& symbol : m_symbols) {
      known += (known.empty() ? "" : ", ") + symbol.name;
    }
    fail(column, fmt::format("unknown name '{}' (arguments and outputs: {})", name,
                             known.empty() ? "none" : known));
  }

  std::int32_t find_symbol(std::string_view name) const {
    for (std::size_t i = 0; i < m_symbols.size(); ++i) {
      if (m_symbols[i].name == name) {
        return static_cast<std::int32_t>(i);
      }
    }
    return -1;
  }

  static constexpr int k_max_depth = 200;
  int m_depth = 0;
  std::string_view m_text;
  const std::vector<Symbol>& m_symbols;
  std::vector<Node>& m_nodes;
  std::size_t m_pos = 0;
  std::size_t m_token_start = 0;
  Token m_token = Token::end;
  std::string_view m_token_text;
};

} // namespace

Expr Expr::parse(std::string_view text, const std::vector<Symbol>& symbols) {
  Expr expr;
  expr.m_text = std::string(text);
  if (text.size() > 4096) {
    throw ExprError(1, "expression is longer than 4096 characters");
  }
  Parser parser(expr.m_text, symbols, expr.m_nodes);
  expr.m_root = parser.parse_all();
  if (expr.m_nodes.size() > std::numeric_limits<std::int32_t>::max() / 2) {
    throw ExprError(1, "expression is too large");
  }
  return expr;
}

bool Expr::uses_device() const noexcept {
  return std::any_of(m_nodes.begin(), m_nodes.end(), [](const Node& n) {
    return n.op == NodeOp::device_prop || n.op == NodeOp::aligned;
  });
}

bool Expr::uses(std::int32_t symbol) const noexcept {
  for (const auto& node : m_nodes) {
    if (node.op == NodeOp::symbol && node.a == symbol) {
      return true;
    }
  }
  return false;
}

} // namespace kjit::detail
