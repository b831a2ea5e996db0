// fmt's compiled half, built once into the library. libtorch ships fmt's headers only (and its
// CMake config exports no fmt library); used header-only (FMT_HEADER_ONLY), every translation unit
// that formats a message compiles fmt's implementation again, about 2 s each here. So the library
// compiles it in this one file and the others see declarations.
#include <fmt/format-inl.h>

FMT_BEGIN_NAMESPACE
namespace detail {
template FMT_API auto thousands_sep_impl(locale_ref) -> thousands_sep_result<char>;
template FMT_API auto thousands_sep_impl(locale_ref) -> thousands_sep_result<wchar_t>;
template FMT_API auto decimal_point_impl(locale_ref) -> char;
template FMT_API auto decimal_point_impl(locale_ref) -> wchar_t;
}  // namespace detail
#if FMT_USE_LOCALE
template FMT_API auto locale_ref::get<std::locale>() const -> std::locale;  // locale-aware formatting
#endif
FMT_END_NAMESPACE
