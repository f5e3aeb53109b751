// The lexical stance-conflict detector of mdl_jax/signals/conflict.py in C++, for stores in bulk.
//
// It computes the very flags of conflict.analyse / conflict.analyses_conflict (tests/test_conflict_native.py
// checks them against the Python reference, pair by pair, on generated texts and on every store of the
// bundled datasets), ~20x faster: the Python detector was half of the cached gate's time per row.
//
// The word lists are not repeated here: MdlLexNew receives them from conflict.py (one source of truth),
// and a handle holds its own tables, so the library keeps no global state and calls are thread-safe.
//
// Input texts are bytes. An ASCII text is passed as it is and lowered here (ASCII lowering equals
// Python's str.lower on ASCII); any other text is lowered by Python first (str.lower is Unicode-aware,
// and can even map non-ASCII letters to ASCII ones, e.g. the Kelvin sign to "k") with its right single
// quotes made apostrophes, then sent as UTF-8. Bytes >= 0x80 never match the word pattern
// [a-z0-9]+(?:'[a-z]+)?, and the ignored phrases are ASCII, so a match in the UTF-8 bytes is a match in
// the string: the same words either way.
#include <algorithm>
#include <bitset>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace {

constexpr int kMaxAnt = 256;  // antonym-pair words a handle can hold (conflict.py has 65)
using AntSet = std::bitset<kMaxAnt>;

constexpr uint8_t kStop = 1, kNeg = 2, kAnt = 4;

struct Entry {
  uint8_t kind = 0;
  int ant = -1;  // index of an antonym-pair word
};

struct Slot {
  uint64_t hash = 0;
  std::string_view word;  // empty: a free slot
  Entry entry;
};

struct Lexicon {
  std::vector<std::string> owned;  // the words the table's slots view
  // The same words in an open-addressing table keyed by the hash the analysis computes anyway
  // (a topic word's hash is that one too): a look-up is one hash and, mostly, one slot, where the map
  // hashed the word a second time and chased a bucket list. Power-of-two size, ≥ 4× the words.
  std::vector<Slot> table;
  uint64_t mask = 0;
  size_t max_len = 0;  // a longer token is in no list: no look-up
  std::vector<std::string> phrases;  // replaced by one space, in order, as str.replace does
  std::string phrase_hint;           // their common prefix ("no"): a text without it has none of them
  std::vector<AntSet> opposite;      // opposite[i]: the words paired with antonym word i
  double min_shared = 0.34;
  int n_ant = 0;
};

// One analysed text: conflict.analyse's five values.
struct Analysis {
  bool negated = false;
  uint8_t first = 0;   // 0 other (or no word), 1 "yes", 2 "no"
  AntSet ant;          // antonym words among the content words
  AntSet ant_all;      // antonym words among all words
  uint32_t topic_begin = 0, topic_end = 0;  // range in the call's topic-word array
};

struct Word {
  uint64_t hash;
  std::string_view text;
};

inline bool word_less(const Word& a, const Word& b) {
  return a.hash != b.hash ? a.hash < b.hash : a.text < b.text;
}

// FNV-1a: only equality matters (equal words, equal hashes; ties fall back to the bytes). Tried: 8 bytes a
// step with a multiply, slower here (the tail's variable-length copy).
inline uint64_t word_hash(std::string_view s) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : s) h = (h ^ c) * 1099511628211ull;
  return h;
}

// The entry of a token whose word_hash is h, or nullptr.
inline const Entry* lookup(const Lexicon& lex, std::string_view w, uint64_t h) {
  if (w.size() > lex.max_len) return nullptr;
  for (uint64_t i = h & lex.mask;; i = (i + 1) & lex.mask) {
    const Slot& s = lex.table[i];
    if (s.word.empty()) return nullptr;
    if (s.hash == h && s.word == w) return &s.entry;
  }
}

void build_table(Lexicon& lex, const std::unordered_map<std::string_view, Entry>& words) {
  size_t size = 16;
  while (size < 4 * words.size()) size <<= 1;
  lex.table.assign(size, Slot());
  lex.mask = size - 1;
  for (const auto& [w, e] : words) {
    if (w.empty()) continue;
    const uint64_t h = word_hash(w);
    uint64_t i = h & lex.mask;
    while (!lex.table[i].word.empty()) i = (i + 1) & lex.mask;
    lex.table[i] = Slot{h, w, e};
    lex.max_len = std::max(lex.max_len, w.size());
  }
}

inline bool is_alnum(unsigned char c) { return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9'); }
inline bool is_alpha(unsigned char c) { return c >= 'a' && c <= 'z'; }

std::vector<std::string_view> split(const char* joined, int64_t n, char sep) {
  std::vector<std::string_view> out;
  int64_t start = 0;
  for (int64_t i = 0; i <= n; ++i) {
    if (i == n || joined[i] == sep) {
      if (i > start) out.emplace_back(joined + start, i - start);
      start = i + 1;
    }
  }
  return out;
}

// Sequential non-overlapping left-to-right replacement of each phrase by " " in t[from:] (Python's
// str.replace, phrase after phrase: a replacement can join text into a later phrase, and does here
// too). In place: a phrase is never shorter than its replacement, so the text only shrinks.
void replace_phrases(std::string& t, size_t from, const std::vector<std::string>& phrases,
                     const std::string& hint) {
  if (!hint.empty() && t.find(hint, from) == std::string::npos) return;  // one scan, not one per phrase
  for (const std::string& p : phrases) {
    const size_t k = p.size();
    size_t pos = t.find(p, from);
    if (pos == std::string::npos || k == 0) continue;
    size_t w = pos;
    while (pos != std::string::npos) {
      t[w++] = ' ';
      const size_t next = t.find(p, pos + k);
      const size_t stop = next == std::string::npos ? t.size() : next;
      for (size_t r = pos + k; r < stop; ++r) t[w++] = t[r];
      pos = next;
    }
    t.resize(w);
  }
}

// Analyses texts into one buffer (the texts lowered, their phrases replaced) and one topic-word array.
// Topic words view the buffer: the caller reserves the buffer for a group's bytes before its first
// text, and every text takes at most its own length, so the views stay valid for the group.
class Analyser {
 public:
  explicit Analyser(const Lexicon& lex) : lex_(lex) {}

  Analysis run(std::string_view raw, std::string& buf, std::vector<Word>& topics) {
    const size_t base = buf.size();
    buf.append(raw);
    for (size_t k = base; k < buf.size(); ++k) {
      char& c = buf[k];
      if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
    }
    replace_phrases(buf, base, lex_.phrases, lex_.phrase_hint);
    Analysis a;
    a.topic_begin = static_cast<uint32_t>(topics.size());
    const size_t n = buf.size();
    const unsigned char* s = reinterpret_cast<const unsigned char*>(buf.data());
    bool first_seen = false;
    size_t i = base;
    while (i < n) {
      if (!is_alnum(s[i])) {
        ++i;
        continue;
      }
      size_t j = i;
      while (j < n && is_alnum(s[j])) ++j;
      if (j + 1 < n && s[j] == '\'' && is_alpha(s[j + 1])) {
        j += 2;
        while (j < n && is_alpha(s[j])) ++j;
      }
      std::string_view w(buf.data() + i, j - i);
      i = j;
      if (!first_seen) {
        first_seen = true;
        a.first = w == "yes" ? 1 : w == "no" ? 2 : 0;
      }
      const uint64_t h = word_hash(w);
      const Entry* e = lookup(lex_, w, h);
      const uint8_t kind = e == nullptr ? 0 : e->kind;
      if (kind & kAnt) a.ant_all.set(e->ant);
      if (kind & kNeg) {
        a.negated = true;
        continue;
      }
      // a word ending in n't is a contraction: a negator, never content
      if (w.size() >= 3 && w.compare(w.size() - 3, 3, "n't") == 0) {
        a.negated = true;
        continue;
      }
      if (kind & kStop) continue;
      if (kind & kAnt) {
        a.ant.set(e->ant);  // antonym words are left out of the topic overlap
        continue;
      }
      topics.push_back(Word{h, w});
    }
    // a set: sorted, duplicates dropped
    auto b = topics.begin() + a.topic_begin;
    std::sort(b, topics.end(), word_less);
    auto e = std::unique(b, topics.end(), [](const Word& x, const Word& y) { return x.hash == y.hash && x.text == y.text; });
    topics.erase(e, topics.end());
    a.topic_end = static_cast<uint32_t>(topics.size());
    return a;
  }

 private:
  const Lexicon& lex_;
};

bool conflict(const Lexicon& lex, const Analysis& x, const Analysis& y, const std::vector<Word>& topics) {
  if ((x.first == 1 && y.first == 2) || (x.first == 2 && y.first == 1)) return true;
  const int64_t la = x.topic_end - x.topic_begin, lb = y.topic_end - y.topic_begin;
  if (la == 0 || lb == 0) return false;  // overlap 0.0 < MIN_SHARED
  int64_t shared = 0;
  uint32_t i = x.topic_begin, j = y.topic_begin;
  while (i < x.topic_end && j < y.topic_end) {
    if (word_less(topics[i], topics[j])) {
      ++i;
    } else if (word_less(topics[j], topics[i])) {
      ++j;
    } else {
      ++shared, ++i, ++j;
    }
  }
  // the same double division and comparison as conflict._overlap / _conflict
  const double overlap = static_cast<double>(shared) / static_cast<double>(la + lb - shared);
  if (overlap < lex.min_shared) return false;
  if (x.negated != y.negated) return true;
  // w in x's content antonyms, absent from y; an opposite of w in y, absent from x
  const AntSet candidates = x.ant & ~y.ant_all;
  if (candidates.none()) return false;
  for (int w = 0; w < lex.n_ant; ++w) {
    if (candidates.test(w) && (lex.opposite[w] & y.ant_all & ~x.ant_all).any()) return true;
  }
  return false;
}

}  // namespace

// MdlLexFlags after its argument checks.
static int64_t lex_flags(const Lexicon& lex, const char* data, const int64_t* offsets, int64_t n_texts,
                         const int64_t* group_start, int64_t n_groups, uint8_t* pair_flags, int64_t* counts) {
  Analyser analyser(lex);
  std::vector<Analysis> an;
  std::vector<Word> topics;
  std::string buf;
  int64_t written = 0;
  for (int64_t g = 0; g < n_groups; ++g) {
    const int64_t lo = group_start[g], hi = group_start[g + 1];  // checked: 0 ≤ lo ≤ hi ≤ n_texts
    an.clear();
    topics.clear();
    buf.clear();
    // the topic words view buf: it must not move while the group is analysed
    if (hi > lo) buf.reserve(static_cast<size_t>(offsets[hi] - offsets[lo]));
    for (int64_t k = lo; k < hi; ++k) {
      an.push_back(analyser.run(std::string_view(data + offsets[k], offsets[k + 1] - offsets[k]), buf, topics));
    }
    int64_t c = 0;
    const int64_t n = static_cast<int64_t>(an.size());
    for (int64_t i = 0; i < n; ++i) {
      for (int64_t j = i + 1; j < n; ++j) {
        const bool f = conflict(lex, an[i], an[j], topics);
        c += f;
        if (pair_flags) pair_flags[written] = f;
        ++written;
      }
    }
    if (counts) counts[g] = c;
  }
  return written;
}


extern "C" {

// A lexicon from conflict.py's lists: each a string of words joined by '\n' (phrases too); antonym
// pairs as "a b" lines. Returns nullptr when there are more than kMaxAnt antonym words (or on an
// exception: MdlLexNew lets none cross into Python).
static void* lex_new(const char* negators, int64_t n_neg, const char* stopwords, int64_t n_stop,
                     const char* pairs, int64_t n_pairs, const char* phrases, int64_t n_phr, double min_shared) {
  auto* lex = new Lexicon();
  std::unordered_map<std::string_view, Entry> words;  // built here, then laid out in lex->table
  lex->min_shared = min_shared;
  auto own = [lex](std::string_view w) -> std::string_view {
    lex->owned.emplace_back(w);
    return lex->owned.back();
  };
  std::vector<std::string_view> neg = split(negators, n_neg, '\n'), stop = split(stopwords, n_stop, '\n'),
                                pr = split(pairs, n_pairs, '\n'), ph = split(phrases, n_phr, '\n');
  lex->owned.reserve(neg.size() + stop.size() + 2 * pr.size() + 1);  // views stay valid: no reallocation
  std::vector<std::pair<int, int>> opp;
  auto ant_index = [&](std::string_view w) {
    auto it = words.find(w);
    if (it == words.end()) it = words.emplace(own(w), Entry{}).first;
    if (it->second.ant < 0) it->second.ant = lex->n_ant++;
    it->second.kind |= kAnt;
    return it->second.ant;
  };
  for (std::string_view line : pr) {
    const size_t sp = line.find(' ');
    if (sp == std::string_view::npos) continue;
    opp.emplace_back(ant_index(line.substr(0, sp)), ant_index(line.substr(sp + 1)));
  }
  if (lex->n_ant > kMaxAnt) {
    delete lex;
    return nullptr;
  }
  auto mark = [&](const std::vector<std::string_view>& ws, uint8_t kind) {
    for (std::string_view w : ws) {
      auto it = words.find(w);
      if (it == words.end()) it = words.emplace(own(w), Entry{}).first;
      it->second.kind |= kind;
    }
  };
  mark(neg, kNeg);
  mark(stop, kStop);
  lex->opposite.assign(lex->n_ant, AntSet());
  for (auto [a, b] : opp) {
    lex->opposite[a].set(b);
    lex->opposite[b].set(a);
  }
  for (std::string_view p : ph) lex->phrases.emplace_back(p);
  if (!lex->phrases.empty()) {
    std::string hint = lex->phrases[0];
    for (const std::string& p : lex->phrases) {
      size_t k = 0;
      while (k < hint.size() && k < p.size() && hint[k] == p[k]) ++k;
      hint.resize(k);
    }
    lex->phrase_hint = hint;
  }
  build_table(*lex, words);
  return lex;
}

void* MdlLexNew(const char* negators, int64_t n_neg, const char* stopwords, int64_t n_stop,
                const char* pairs, int64_t n_pairs, const char* phrases, int64_t n_phr, double min_shared) {
  try {
    return lex_new(negators, n_neg, stopwords, n_stop, pairs, n_pairs, phrases, n_phr, min_shared);
  } catch (...) {
    return nullptr;
  }
}

void MdlLexFree(void* lex) { delete static_cast<Lexicon*>(lex); }

// Flags of the pairs within each group of texts. Texts: data[offsets[k]:offsets[k+1]], k < n_texts;
// group g holds texts group_start[g] .. group_start[g+1]-1 (n_groups + 1 entries). For each group of
// n texts its n(n-1)/2 pairs (i < j, row-major) are written to pair_flags (when not null, one byte
// each, groups back to back) and their sum to counts[g] (when not null). Returns the pairs written.
// Returns -2 when the group starts are not a non-decreasing sequence within [0, n_texts], -1 when an
// exception (an allocation that failed) stopped the call: no C++ exception ever crosses into Python.
int64_t MdlLexFlags(const void* handle, const char* data, const int64_t* offsets, int64_t n_texts,
                    const int64_t* group_start, int64_t n_groups, uint8_t* pair_flags, int64_t* counts) {
  for (int64_t g = 0; g < n_groups; ++g) {
    if (group_start[g] < 0 || group_start[g] > group_start[g + 1] || group_start[g + 1] > n_texts) return -2;
  }
  try {
    return lex_flags(*static_cast<const Lexicon*>(handle), data, offsets, n_texts, group_start, n_groups,
                     pair_flags, counts);
  } catch (...) {
    return -1;
  }
}

}  // extern "C"

