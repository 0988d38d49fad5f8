// The hash containers of the library: std::unordered_map / std::unordered_set. Abseil's flat tables
// are faster, but a throwing allocation inside one of them (a rehash under memory pressure) leaves
// it with a capacity that does not match its storage, and its destructor then crashes while the
// exception unwinds: an allocation failure must end as MOE_ERR_NO_MEMORY at the C ABI, so every
// table in lib/ and backends/ is one of these (tests/runtime/layering_test.cc keeps it so).
#pragma once

#include <unordered_map>
#include <unordered_set>

namespace strata {

template <typename K, typename V, typename Hash = std::hash<K>, typename Eq = std::equal_to<K>>
using HashMap = std::unordered_map<K, V, Hash, Eq>;

template <typename K, typename Hash = std::hash<K>, typename Eq = std::equal_to<K>>
using HashSet = std::unordered_set<K, Hash, Eq>;

}  // namespace strata
