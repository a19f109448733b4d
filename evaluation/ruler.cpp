#include "evaluation/ruler.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstring>
#include <functional>
#include <numbers>
#include <set>

#include "core/error.h"
#include "core/splitmix.h"
#include "evaluation/model_eval.h"
#include "fmt/format.h"

namespace kvq::eval {
namespace {

// The word pool: English adjectives, nouns and verbs of the kinds RULER takes from the
// wonderwords package (which kvq does not ship), chosen so that no word is a substring of another
// (RULER's scoring is a substring test, so a value inside another would count as found).
// 194 Adjectives
constexpr std::string_view kAdjectives =
    "able acid aged alert ample angry awake bald bare basic beige bitter blank bleak blind "
    "blunt bold brave brief brisk broad brown busy calm cheap chief chilly civic clean clever "
    "close coarse cosmic cozy crisp cruel curly damp dark dear deep dense dizzy dreary dusty "
    "eager early eerie elder empty equal exact faint fancy fierce firm flat fluffy fond foggy "
    "frail fresh frosty funny fuzzy giant gentle gifted glad gloomy glossy golden grand grassy "
    "greasy gritty grumpy handy happy hardy harsh hasty heavy hollow honest humble hungry icy "
    "ideal idle jolly keen kind lanky large lazy level light lively lonely loud loyal lucky "
    "lunar mellow merry mighty misty modern moist muddy murky narrow naughty neat nimble noble "
    "noisy normal nutty oval pale patient plain plump polite proud quick quiet rapid rare rigid "
    "ripe rocky rosy rough royal rusty sandy scary sharp shiny shy silent silky silly simple "
    "sleepy slim slow small smooth snowy soft solid sour steep sticky stormy strict sturdy "
    "sunny super sweet swift tall tame tender tense thick tidy tiny tough tricky upbeat urban "
    "vacant vague vast vivid warm wary weary wicked wide wild windy wise witty wooden woolly "
    "young zany zealous";
// 202 Nouns
constexpr std::string_view kNouns =
    "acorn actor agent album anchor angle ankle apple apron atlas attic badge bagel baker banjo "
    "barn basket beacon beaver bench berry blossom bottle bracket bread brick bridge broom "
    "bubble bucket buffalo bugle cabin cactus camel candle canoe canyon carpet castle cattle "
    "cellar chalk channel cherry chimney circus clock clover coast cobra coffee collar comet "
    "copper cottage cotton crater crayon cricket crown cushion dagger dancer desert diamond "
    "dinner doctor dolphin donkey dragon drawer eagle easel elbow engine falcon feather fence "
    "fiddle finger flag flute forest fountain fridge garden garlic gazelle glacier glove goblet "
    "gravel guitar hammer harbor hawk helmet hermit hornet igloo island jacket jelly jigsaw "
    "kettle kitten ladder lagoon lantern lemon letter lizard locket magnet mango marble meadow "
    "melon mirror monkey motor mountain muffin napkin needle novel oasis ocean olive onion "
    "orbit otter oven owl paddle palace panda parrot pebble pencil pepper piano pigeon pillow "
    "pirate planet pocket potato puzzle quilt rabbit radio raven ribbon river robot rocket "
    "saddle salmon sandal satchel scarf school scooter shadow shovel signal singer sketch sled "
    "spider spoon squirrel statue sugar summit sweater teapot temple thimble ticket tiger "
    "timber toast tomato tower trumpet tulip tunnel turtle umbrella valley vessel violin wagon "
    "walnut walrus wizard window yacht zebra";
// 69 Verbs
constexpr std::string_view kVerbs =
    "adopt argue balance borrow breathe build carry catch chase climb collect cook crawl "
    "deliver dig drift elect enjoy escape explore fetch float fold gather glide grow guard hike "
    "hover hunt invent juggle knit laugh launch listen measure mend obey paint polish pour "
    "print pursue quarrel rescue ride roam sail scatter search sew shiver skate sniff solve "
    "sort stir stroll swim teach travel tumble vanish wander wash whistle wrap yawn";

std::vector<std::string> split_words(std::string_view s) {
  std::vector<std::string> out;
  for (size_t a = 0; a < s.size();) {
    const size_t b = std::min(s.find(' ', a), s.size());
    if (b > a) out.emplace_back(s.substr(a, b - a));
    a = b + 1;
  }
  return out;
}

const std::vector<std::string>& adjectives() {
  static const std::vector<std::string> w = split_words(kAdjectives);
  return w;
}
const std::vector<std::string>& nouns() {
  static const std::vector<std::string> w = split_words(kNouns);
  return w;
}

// A case's random stream: splitmix64, uniform draws by Lemire's multiply-shift.
struct Rng {
  uint64_t state;
  uint64_t next() { return splitmix64(state); }
  size_t below(size_t n) {
    return static_cast<size_t>((static_cast<unsigned __int128>(next()) * n) >> 64);
  }
  template <class T>
  void shuffle(std::vector<T>& v) {  // Fisher-Yates
    for (size_t i = v.size(); i > 1; --i) std::swap(v[i - 1], v[below(i)]);
  }
};

uint64_t fnv1a(std::string_view s) {
  uint64_t h = 0xcbf29ce484222325ULL;
  for (unsigned char c : s) h = (h ^ c) * 0x100000001b3ULL;
  return h;
}

// RULER's value kinds: a 7-digit number, an adjective-noun word, a version-4 UUID.
enum class Kind { Number, Word, Uuid };
const char* plural(Kind k) {
  return k == Kind::Number ? "numbers" : k == Kind::Word ? "words" : "uuids";
}
std::string draw(Kind k, Rng& r) {
  switch (k) {
    case Kind::Number:
      return std::to_string(1000000 + r.below(9000000));
    case Kind::Word:
      return adjectives()[r.below(adjectives().size())] + "-" + nouns()[r.below(nouns().size())];
    case Kind::Uuid: {  // Python's uuid.UUID(int=getrandbits(128), version=4)
      uint64_t hi = r.next(), lo = r.next();
      hi = (hi & ~0xf000ULL) | 0x4000ULL;                  // version 4
      lo = (lo & ~(0xc000ULL << 48)) | (0x8000ULL << 48);  // variant 10
      return fmt::format("{:08x}-{:04x}-{:04x}-{:04x}-{:012x}", hi >> 32, (hi >> 16) & 0xffff,
                         hi & 0xffff, lo >> 48, lo & 0xffffffffffffULL);
    }
  }
  return {};
}
// A draw not yet in `used` (then added to it).
std::string fresh(Kind k, Rng& r, std::set<std::string>& used) {
  for (;;) {
    std::string s = draw(k, r);
    if (used.insert(s).second) return s;
  }
}

std::vector<int32_t>& append(std::vector<int32_t>& to, const std::vector<int32_t>& ids) {
  to.insert(to.end(), ids.begin(), ids.end());
  return to;
}

// The chat template around one user message: the tokens before and after its content (the
// latter opening the assistant turn).
struct Chat {
  std::vector<int32_t> head, tail;
};
Chat chat_wrap(const Tokenizer& tok) {
  const std::string s = tok.chat({{"user", "\x1f"}});
  const size_t at = s.find('\x1f');
  return {tok.encode(s.substr(0, at), true), tok.encode(s.substr(at + 1), true)};
}

// A prompt: the chat template around before + context + after, then the answer prefix (RULER's,
// its leading and trailing blanks dropped: it opens the assistant turn here).
struct Frame {
  std::string before, after, prefix;
};
std::string trim(std::string_view s) {
  const size_t a = s.find_first_not_of(" \n"), b = s.find_last_not_of(" \n");
  return a == std::string_view::npos ? std::string() : std::string(s.substr(a, b - a + 1));
}
struct Fixed {  // a frame's tokens around the context
  std::vector<int32_t> pre, post;
  int64_t size() const { return static_cast<int64_t>(pre.size() + post.size()); }
};
Fixed fixed_tokens(const Tokenizer& tok, const Frame& f) {
  const Chat c = chat_wrap(tok);
  Fixed x;
  x.pre = c.head;
  append(x.pre, tok.encode(f.before));
  x.post = tok.encode(f.after);
  append(x.post, c.tail);
  append(x.post, tok.encode(trim(f.prefix)));
  return x;
}
std::vector<int32_t> assemble(const Fixed& x, const std::vector<int32_t>& context) {
  std::vector<int32_t> p = x.pre;
  append(p, context);
  return append(p, x.post);
}

// The first `fill` tokens of `hay` (lines of text) with `lines` inserted, each at the start of a
// line: line i at the slot `slot[i]` of the line starts within the fill (0: the very start);
// slots ascend.
std::vector<int32_t> fill_lines(const Tokenizer& tok, const std::vector<int32_t>& hay, int64_t fill,
                                const std::vector<std::vector<int32_t>>& lines,
                                const std::function<size_t(size_t starts)>& slot_of) {
  KVQ_CHECK(fill >= 0 && fill <= static_cast<int64_t>(hay.size()),
            "ruler: the haystack has {} tokens, fewer than the {} the case needs", hay.size(),
            fill);
  std::vector<int64_t> starts{0};
  for (int64_t p = 1; p <= fill; ++p) {
    const std::string_view b = tok.token_bytes(hay[static_cast<size_t>(p - 1)]);
    if (!b.empty() && b.back() == '\n') starts.push_back(p);
  }
  std::vector<int64_t> at;
  for (size_t i = 0; i < lines.size(); ++i) at.push_back(starts[slot_of(starts.size())]);
  std::sort(at.begin(), at.end());
  std::vector<int32_t> out;
  int64_t from = 0;
  for (size_t i = 0; i < lines.size(); ++i) {
    out.insert(out.end(), hay.begin() + from, hay.begin() + at[i]);
    append(out, lines[i]);
    from = at[i];
  }
  out.insert(out.end(), hay.begin() + from, hay.begin() + fill);
  return out;
}

// The lines to insert into the haystack, as tokens, and how many haystack tokens a prompt of
// prompt_len tokens leaves for them.
struct Inserted {
  std::vector<std::vector<int32_t>> lines;
  int64_t fill = 0;
};
Inserted inserted_lines(const Tokenizer& tok, const Fixed& x, int prompt_len,
                        const std::vector<std::string>& texts) {
  Inserted in{{}, prompt_len - x.size()};
  for (const auto& t : texts) {
    in.lines.push_back(tok.encode(t + "\n"));
    in.fill -= static_cast<int64_t>(in.lines.back().size());
  }
  KVQ_CHECK(in.fill >= 1,
            "ruler: a {}-token prompt leaves no room for the haystack ({} tokens go around it)",
            prompt_len, prompt_len - in.fill);
  return in;
}

// RULER's DEPTHS: 40 needle depths, round(linspace(0, 100, 40)) percent.
std::vector<int> ruler_depths() {
  std::vector<int> d;
  for (int i = 0; i < 40; ++i) d.push_back(static_cast<int>(std::lround(100.0 * i / 39.0)));
  return d;
}

std::vector<int32_t> repeat_noise(const Tokenizer& tok, int64_t at_least) {
  const std::vector<int32_t> unit = tok.encode(kRulerNoise);
  std::vector<int32_t> out;
  while (static_cast<int64_t>(out.size()) < at_least) append(out, unit);
  return out;
}

std::string join_query(const std::vector<std::string>& q) {  // "a, b, and c"
  if (q.size() == 1) return q[0];
  std::string s;
  for (size_t i = 0; i + 1 < q.size(); ++i) s += (i ? ", " : "") + q[i];
  return s + ", and " + q.back();
}

// niah: RULER's niah.py. Haystack: 'n' noise, 't' the text (RULER's essay), 'd' distractor
// needles.
struct Niah {
  char hay;
  Kind key, value;
  int keys = 1, values = 1, queries = 1;
};

RulerCase niah_case(const Tokenizer& tok, const RulerHaystack& hs, const Niah& t, int prompt_len,
                    Rng& r) {
  const char hay = t.hay == 't' && hs.noise ? 'n' : t.hay;
  const int nk = std::max(t.keys, t.queries);
  std::set<std::string> used;
  std::vector<std::string> keys;
  std::vector<std::vector<std::string>> values;
  std::vector<std::string> needles;
  const auto needle = [&](const std::string& k, const std::string& v) {
    return fmt::format("One of the special magic {} for {} is: {}.", plural(t.value), k, v);
  };
  for (int i = 0; i < nk; ++i) {
    keys.push_back(fresh(t.key, r, used));
    values.emplace_back();
    for (int j = 0; j < t.values; ++j) {
      values.back().push_back(fresh(t.value, r, used));
      needles.push_back(needle(keys.back(), values.back().back()));
    }
  }
  r.shuffle(needles);
  std::vector<size_t> idx(static_cast<size_t>(nk));
  for (size_t i = 0; i < idx.size(); ++i) idx[i] = i;
  r.shuffle(idx);  // random.sample(range(nk), nq)
  std::vector<std::string> query;
  RulerCase c;
  for (int q = 0; q < t.queries; ++q) {
    query.push_back(keys[idx[static_cast<size_t>(q)]]);
    for (const auto& v : values[idx[static_cast<size_t>(q)]]) c.answers.push_back(v);
  }
  const std::string qs = join_query(query);
  Frame f;
  if (t.queries * t.values == 1) {  // RULER's singular form of its template
    const std::string ty(plural(t.value), std::strlen(plural(t.value)) - 1);
    f.before = fmt::format(
        "A special magic {0} is hidden within the following text. Make sure to memorize it. I "
        "will quiz you about the {0} afterwards.\n",
        ty);
    f.after = fmt::format("\nWhat is the special magic {} for {} mentioned in the provided text?",
                          ty, qs);
    f.prefix =
        fmt::format(" The special magic {} for {} mentioned in the provided text is", ty, qs);
  } else {
    const char* ty = plural(t.value);
    f.before = fmt::format(
        "Some special magic {0} are hidden within the following text. Make sure to memorize it. "
        "I will quiz you about the {0} afterwards.\n",
        ty);
    f.after = fmt::format(
        "\nWhat are all the special magic {} for {} mentioned in the provided text?", ty, qs);
    f.prefix =
        fmt::format(" The special magic {} for {} mentioned in the provided text are", ty, qs);
  }
  const Fixed x = fixed_tokens(tok, f);
  const Inserted ins = inserted_lines(tok, x, prompt_len, needles);
  const auto& lines = ins.lines;
  const int64_t fill = ins.fill;
  std::vector<int32_t> stream;
  if (hay == 't') {
    stream = hs.text;
  } else if (hay == 'n') {
    stream = repeat_noise(tok, fill);
  } else {  // RULER's "needle" haystack: lines of needles for other keys and values
    while (static_cast<int64_t>(stream.size()) < fill)
      append(stream, tok.encode(needle(fresh(t.key, r, used), fresh(t.value, r, used)) + "\n"));
  }
  // RULER: the essay's needles at depths drawn from DEPTHS without replacement, the other
  // haystacks' at random lines; both come down to line starts drawn at random here.
  std::vector<int> depths = ruler_depths();
  r.shuffle(depths);
  size_t n = 0;
  const auto slot = [&](size_t starts) {
    const double d = depths[n++ % depths.size()] / 100.0;
    return std::min(starts - 1, static_cast<size_t>(d * static_cast<double>(starts)));
  };
  c.prompt = assemble(x, fill_lines(tok, stream, fill, lines, slot));
  return c;
}

// vt: RULER's variable_tracking.py: one chain of 4 hops in the noise, with a one-shot example
// (3-letter names, as RULER's) before the question.
std::string vt_names(Rng& r, int letters, int n, std::set<std::string>& used) {
  std::string all;
  for (int i = 0; i < n; ++i) {
    std::string s;
    do {
      s.clear();
      for (int j = 0; j < letters; ++j) s += static_cast<char>('A' + r.below(26));
    } while (!used.insert(s).second);
    all += (i ? " " : "") + s;
  }
  return all;
}
std::vector<std::string> chain(const std::vector<std::string>& names, int value) {
  std::vector<std::string> out{fmt::format("VAR {} = {}", names[0], value)};
  for (size_t j = 1; j < names.size(); ++j)
    out.push_back(fmt::format("VAR {} = VAR {}", names[j], names[j - 1]));
  return out;
}
constexpr std::string_view kVtTask =
    "Memorize and track the chain(s) of variable assignment hidden in the following text.\n\n";
std::string vt_question(int value) {
  return fmt::format(
      "\nQuestion: Find all variables that are assigned the value {} in the text above.", value);
}
std::string vt_prefix(int n, int value) {  // RULER's words, its "assgined" included
  return fmt::format(
      " Answer: According to the chain(s) of variable assignment in the text above, {} variables "
      "are assgined the value {}, they are: ",
      n, value);
}

RulerCase vt_case(const Tokenizer& tok, int prompt_len, Rng& r) {
  constexpr int kHops = 4;
  // The example: the most noise lines (in steps of 5, as RULER) that keep it within RULER's 500
  // tokens with its 30 to generate; its own stream, so its size changes none of the case's draws.
  const Rng ex_rng{r.next()};
  const auto example = [&](int noise) {
    Rng e = ex_rng;
    std::set<std::string> u;
    const std::vector<std::string> names = split_words(vt_names(e, 3, kHops + 1, u));
    const int value = 10000 + static_cast<int>(e.below(89999));
    std::vector<std::string> lines(static_cast<size_t>(noise), std::string(kRulerNoise));
    std::vector<size_t> pos(lines.size());
    for (size_t i = 0; i < pos.size(); ++i) pos[i] = i;
    e.shuffle(pos);
    pos.resize(kHops + 1);
    std::sort(pos.begin(), pos.end());
    const auto ch = chain(names, value);
    for (size_t j = 0; j < ch.size(); ++j)
      lines.insert(lines.begin() + static_cast<long>(pos[j] + j), ch[j] + "\n");
    std::string ctx;
    for (const auto& l : lines) ctx += l;
    std::string names_joined;
    for (const auto& n : names) names_joined += (names_joined.empty() ? "" : " ") + n;
    return std::string(kVtTask) + ctx + vt_question(value).substr(1) + vt_prefix(kHops + 1, value) +
           names_joined;
  };
  int noise = 5;
  while (static_cast<int>(tok.encode(example(noise + 5)).size()) + 30 <= 500) noise += 5;
  const std::string ex = example(noise);
  std::set<std::string> used;
  const std::vector<std::string> names = split_words(vt_names(r, 5, kHops + 1, used));
  const int value = 10000 + static_cast<int>(r.below(89999));
  RulerCase c;
  c.answers = names;
  Frame f{ex + "\n\n" + std::string(kVtTask), vt_question(value), vt_prefix(kHops + 1, value)};
  const Fixed x = fixed_tokens(tok, f);
  const Inserted ins = inserted_lines(tok, x, prompt_len, chain(names, value));
  const auto& lines = ins.lines;
  const int64_t fill = ins.fill;
  // RULER: the chain's statements at random lines of the noise, in order.
  const std::vector<int32_t> stream = repeat_noise(tok, fill);
  std::vector<size_t> slots;
  size_t n = 0;
  const auto slot = [&](size_t starts) {
    if (slots.empty()) {
      std::vector<size_t> all(starts);
      for (size_t i = 0; i < starts; ++i) all[i] = i;
      r.shuffle(all);
      for (size_t i = 0; i < lines.size(); ++i) slots.push_back(all[i % all.size()]);
    }
    return slots[n++];
  };
  c.prompt = assemble(x, fill_lines(tok, stream, fill, lines, slot));
  return c;
}

// cwe: RULER's common_words_extraction.py: 10 words repeated 30 times among others repeated 3
// (6 and 1 below 4,096 tokens), as a numbered list, after a one-shot example.
constexpr std::string_view kCweTask =
    "Below is a numbered list of words. In these words, some appear more often than others. "
    "Memorize the ones that appear most often.\n";
constexpr std::string_view kCweQuestion =
    "\nQuestion: What are the 10 most common words in the above list?";
constexpr std::string_view kCwePrefix =
    " Answer: The top 10 words that appear most often in the list are:";

std::string numbered(const std::vector<std::string>& words) {
  std::string s;
  for (size_t i = 0; i < words.size(); ++i)
    s += fmt::format("{}{}. {}", i ? " " : "", i + 1, words[i]);
  return s;
}

RulerCase cwe_case(const Tokenizer& tok, int length, int prompt_len, Rng& r) {
  constexpr int kCommon = 10;
  const bool small = length < 4096;  // RULER's two settings
  const int cw = small ? 6 : 30, ucw = small ? 1 : 3;
  const int ex_words = small ? 20 : 40, ex_cw = small ? 3 : 10, ex_ucw = small ? 1 : 3;
  std::vector<std::string> pool = ruler_words();
  r.shuffle(pool);
  // The example's words from the end of the pool, the case's from its start: never the same.
  std::vector<std::string> ex_list;
  const auto ex_begin = pool.end() - ex_words;
  for (int i = 0; i < ex_words; ++i)
    for (int k = 0; k < (i < kCommon ? ex_cw : ex_ucw); ++k) ex_list.push_back(ex_begin[i]);
  r.shuffle(ex_list);
  const std::vector<std::string> ex_answer(ex_begin, ex_begin + kCommon);
  const std::string example = std::string(kCweTask) + numbered(ex_list) +
                              std::string(kCweQuestion) + std::string(kCwePrefix) + " " +
                              numbered(ex_answer);
  const Fixed x = fixed_tokens(tok, {example + "\n" + std::string(kCweTask),
                                     std::string(kCweQuestion), std::string(kCwePrefix)});
  // Tokens of entry i's number ("12." after a blank) and of each word (after a blank): the list
  // is their concatenation, so its length for n words is a sum, growing with n.
  const int max_words = static_cast<int>(pool.size()) - ex_words;
  std::vector<int64_t> word_tok;
  for (int i = 0; i < max_words; ++i)
    word_tok.push_back(static_cast<int64_t>(tok.encode(" " + pool[static_cast<size_t>(i)]).size()));
  std::vector<int64_t> num_sum{0};  // num_sum[e]: tokens of the numbers of the first e entries
  const auto entries = [&](int n) { return kCommon * cw + (n - kCommon) * ucw; };
  const auto total = [&](int n) {
    const int e = entries(n);
    while (static_cast<int>(num_sum.size()) <= e) {
      const size_t i = num_sum.size() - 1;
      num_sum.push_back(
          num_sum.back() +
          static_cast<int64_t>(tok.encode(fmt::format("{}{}.", i ? " " : "", i + 1)).size()));
    }
    int64_t t = x.size() + num_sum[static_cast<size_t>(e)];
    for (int i = 0; i < n; ++i) t += word_tok[static_cast<size_t>(i)] * (i < kCommon ? cw : ucw);
    return t;
  };
  KVQ_CHECK(total(kCommon + 1) <= prompt_len,
            "ruler: cwe at {} tokens: no room for a list of {} words ({} tokens)", length,
            kCommon + 1, total(kCommon + 1) + (length - prompt_len));
  int n = kCommon + 1;
  while (n < max_words && total(n + 1) <= prompt_len) ++n;
  KVQ_CHECK(n < max_words, "ruler: cwe at {} tokens needs more than the {} words of the pool",
            length, max_words);
  std::vector<std::string> list;
  for (int i = 0; i < n; ++i)
    for (int k = 0; k < (i < kCommon ? cw : ucw); ++k) list.push_back(pool[static_cast<size_t>(i)]);
  r.shuffle(list);
  std::vector<int32_t> ctx;
  for (size_t i = 0; i < list.size(); ++i) {
    append(ctx, tok.encode(fmt::format("{}{}.", i ? " " : "", i + 1)));
    append(ctx, tok.encode(" " + list[i]));
  }
  RulerCase c;
  c.answers.assign(pool.begin(), pool.begin() + kCommon);
  c.prompt = assemble(x, ctx);
  return c;
}

// fwe: RULER's freq_words_extraction.py: coded words of 6 letters drawn with Zipf counts
// (alpha 2) from a vocabulary of length / 50; the most frequent is "...", the answer the next
// three.
RulerCase fwe_case(const Tokenizer& tok, int length, int prompt_len, Rng& r) {
  constexpr double kAlpha = 2.0, kZeta2 = std::numbers::pi * std::numbers::pi / 6.0;
  const Frame f{
      "Read the following coded text and track the frequency of each coded word. Find the three "
      "most frequently appeared coded words.",
      "\nQuestion: Do not provide any explanation. Please ignore the dots '....'. What are the "
      "three most frequently appeared words in the above coded text?",
      " Answer: According to the coded text above, the three most frequently appeared words "
      "are:"};
  const Fixed x = fixed_tokens(tok, f);
  const std::string fixed_text = tok.decode(x.pre) + tok.decode(x.post);
  const size_t vocab_size = std::max<size_t>(5, static_cast<size_t>(length / 50));
  std::set<std::string> seen;
  std::vector<std::string> vocab;
  while (vocab.size() < vocab_size) {
    std::string w;
    for (int j = 0; j < 6; ++j) w += static_cast<char>('a' + r.below(26));
    if (fixed_text.find(w) == std::string::npos && seen.insert(w).second) vocab.push_back(w);
  }
  std::sort(vocab.begin(), vocab.end());
  r.shuffle(vocab);
  vocab[0] = "...";  // RULER: the top rank is noise
  std::vector<int64_t> word_tok;
  for (const auto& w : vocab) word_tok.push_back(static_cast<int64_t>(tok.encode(" " + w).size()));
  const auto count = [&](int64_t n, size_t k) {  // rank k + 1
    return static_cast<int64_t>(static_cast<double>(n) *
                                std::pow(static_cast<double>(k + 1), -kAlpha) / kZeta2);
  };
  const auto total = [&](int64_t n) {
    int64_t t = x.size();
    for (size_t k = 0; k < vocab.size(); ++k) t += count(n, k) * word_tok[k];
    return t;
  };
  int64_t lo = 1, hi = int64_t{2} * prompt_len;  // total(lo) fits, total(hi) does not
  while (hi - lo > 1) {
    const int64_t mid = (lo + hi) / 2;
    (total(mid) <= prompt_len ? lo : hi) = mid;
  }
  KVQ_CHECK(count(lo, 3) >= 1, "ruler: fwe at {} tokens leaves no room for the coded text", length);
  std::vector<size_t> words;
  for (size_t k = 0; k < vocab.size(); ++k)
    for (int64_t i = 0; i < count(lo, k); ++i) words.push_back(k);
  r.shuffle(words);
  std::vector<int32_t> ctx;
  for (size_t k : words) append(ctx, tok.encode(" " + vocab[k]));
  RulerCase c;
  c.answers.assign(vocab.begin() + 1, vocab.begin() + 4);
  c.prompt = assemble(x, ctx);
  return c;
}

}  // namespace

const std::vector<RulerTask>& ruler_tasks() {
  static const std::vector<RulerTask> t{{"niah_single_1", "niah", 128},
                                        {"niah_single_2", "niah", 128},
                                        {"niah_single_3", "niah", 128},
                                        {"niah_single_words", "niah", 128},
                                        {"niah_multikey_1", "niah", 128},
                                        {"niah_multikey_2", "niah", 128},
                                        {"niah_multikey_3", "niah", 128},
                                        {"niah_multivalue", "niah", 128},
                                        {"niah_multiquery", "niah", 128},
                                        {"vt", "vt", 30},
                                        {"cwe", "cwe", 120},
                                        {"fwe", "fwe", 50}};
  return t;
}

const RulerTask& ruler_task(std::string_view name) {
  std::string names;
  for (const RulerTask& t : ruler_tasks()) {
    if (t.name == name) return t;
    names += (names.empty() ? "" : ", ") + std::string(t.name);
  }
  fail("ruler: no task \"{}\" (tasks: {})", name, names);
}

const std::vector<std::string>& ruler_words() {
  static const std::vector<std::string> w = [] {
    std::vector<std::string> all = split_words(kAdjectives);
    for (auto v : {kNouns, kVerbs})
      for (auto& s : split_words(v)) all.push_back(std::move(s));
    return all;
  }();
  return w;
}

RulerHaystack ruler_haystack(const Tokenizer& tok, const std::string& text, bool noise) {
  RulerHaystack h;
  h.noise = noise;
  if (!noise) h.text = needle_text(tok, text).hay;
  return h;
}

RulerCase ruler_case(const Tokenizer& tok, const RulerHaystack& hay, std::string_view task,
                     int length, uint64_t seed, int sample) {
  const RulerTask& t = ruler_task(task);
  uint64_t s = seed ^ 0x72756c6572ULL;  // "ruler"
  s = splitmix64(s) ^ fnv1a(task);
  s = splitmix64(s) ^ static_cast<uint64_t>(length);
  s = splitmix64(s) ^ static_cast<uint64_t>(sample);
  Rng r{splitmix64(s)};
  const int prompt_len = length - t.gen_tokens;
  KVQ_CHECK(prompt_len >= 64, "ruler: {} at {} tokens leaves no room for a prompt", task, length);
  RulerCase c;
  if (t.group == "niah") {
    static const std::vector<std::pair<std::string_view, Niah>> kNiah{
        {"niah_single_1", {'n', Kind::Word, Kind::Number}},
        {"niah_single_2", {'t', Kind::Word, Kind::Number}},
        {"niah_single_3", {'t', Kind::Word, Kind::Uuid}},
        {"niah_single_words", {'t', Kind::Word, Kind::Word}},
        {"niah_multikey_1", {'t', Kind::Word, Kind::Number, 4}},
        {"niah_multikey_2", {'d', Kind::Word, Kind::Number}},
        {"niah_multikey_3", {'d', Kind::Uuid, Kind::Uuid}},
        {"niah_multivalue", {'t', Kind::Word, Kind::Number, 1, 4}},
        {"niah_multiquery", {'t', Kind::Word, Kind::Number, 1, 1, 4}}};
    for (const auto& [name, spec] : kNiah)
      if (name == task) c = niah_case(tok, hay, spec, prompt_len, r);
  } else if (t.group == "vt") {
    c = vt_case(tok, prompt_len, r);
  } else if (t.group == "cwe") {
    c = cwe_case(tok, length, prompt_len, r);
  } else {
    c = fwe_case(tok, length, prompt_len, r);
  }
  c.gen_tokens = t.gen_tokens;
  return c;
}

RulerOutput ruler_trial(const LlamaModel& m, const Tokenizer& tok, const CacheOptions& cache,
                        const RulerCase& c, int max_new, int threads,
                        const std::function<void()>& poll) {
  const int n = max_new > 0 ? std::min(max_new, c.gen_tokens) : c.gen_tokens;
  std::vector<int32_t> ids = generate(m, cache, c.prompt, n, {tok.eos()}, threads, [&](int32_t) {
    if (poll) poll();
  });
  RulerOutput o;
  o.tokens = static_cast<int>(ids.size());
  if (!ids.empty() && ids.back() == tok.eos()) ids.pop_back();
  o.text = ruler_postprocess(tok.decode(ids));
  o.score = string_match_all(o.text, c.answers);
  return o;
}

std::string ruler_postprocess(std::string_view pred) {
  std::string s(pred);
  for (char& ch : s)
    if (static_cast<unsigned char>(ch) < 0x20) ch = '\n';
  const size_t a = s.find_first_not_of(" \t\n\r\v\f"), b = s.find_last_not_of(" \t\n\r\v\f");
  return a == std::string::npos ? std::string() : s.substr(a, b - a + 1);
}

namespace {
std::string lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}
}  // namespace

double string_match_all(std::string_view pred, const std::vector<std::string>& refs) {
  KVQ_CHECK(!refs.empty(), "ruler: no expected answers to score against");
  const std::string p = lower(pred);
  double hits = 0;
  for (const auto& r : refs) hits += p.find(lower(r)) != std::string::npos;
  return hits / static_cast<double>(refs.size());
}

double string_match_part(std::string_view pred, const std::vector<std::string>& refs) {
  KVQ_CHECK(!refs.empty(), "ruler: no expected answers to score against");
  const std::string p = lower(pred);
  for (const auto& r : refs)
    if (p.find(lower(r)) != std::string::npos) return 1.0;
  return 0.0;
}

}  // namespace kvq::eval
