/* yaml.c — libyaml's event stream turned into a small tree that keeps every mark.
 *
 * The tree is what the schema (spec.c) walks; keeping it lets any later stage point an error
 * at the key that caused it. Aliases share their anchor's node; each node's weight counts
 * the nodes under it with aliases expanded, so an alias bomb is refused in linear time. */
#include <string.h>
#include <yaml.h>

#include "mtc.h"

typedef struct {
  YNode *node;
  YPair *last;
  YNode *key; /* mapping: the key waiting for its value */
  const char *anchor;
} Frame;

typedef struct {
  Mem *m;
  Diag *d;
  const Source *src;
  Frame stack[YAML_MAX_DEPTH + 1];
  int depth;
  MemMap anchors; /* name -> its node (a later anchor of the same name replaces it) */
  MemMap keys;    /* (mapping, key) -> the key's node: duplicates in O(1) each */
  YNode *root;
} Builder;

static Loc mark_loc(const Source *src, yaml_mark_t mk) {
  return (Loc){src, (int)mk.line, (int)mk.column};
}

/* The line and column (in characters) of byte offset off. */
static Loc offset_loc(const Source *src, size_t off) {
  Loc at = {src, 0, 0};
  for (size_t i = 0; i < off && i < src->len; i++) {
    int br = diag_line_break(src->text + i, src->text + src->len);
    if (br) at.line++, at.col = 0, i += (size_t)br - 1;
    else if (((unsigned char)src->text[i] & 0xC0) != 0x80) at.col++;
  }
  return at;
}

static YNode *new_node(Mem *m, YKind kind, Loc loc) {
  YNode *n = mem_alloc(m, sizeof *n);
  n->kind = kind;
  n->loc = loc;
  n->weight = 1;
  return n;
}

YPair *yaml_pair(const YNode *map, const char *key) {
  if (!map || map->kind != Y_MAP) return NULL;
  for (YPair *p = map->first; p; p = p->next)
    if (strcmp(p->key->str, key) == 0) return p;
  return NULL;
}

YNode *yaml_get(const YNode *map, const char *key) {
  YPair *p = yaml_pair(map, key);
  return p ? p->val : NULL;
}

YNode *yaml_path(const YNode *root, const char *path) {
  char seg[64];
  const YNode *n = root;
  for (const char *p = path; n;) {
    const char *dot = strchr(p, '.');
    size_t len = dot ? (size_t)(dot - p) : strlen(p);
    if (len >= sizeof seg) return NULL;
    memcpy(seg, p, len);
    seg[len] = '\0';
    n = yaml_get(n, seg);
    if (!dot) return (YNode *)n;
    p = dot + 1;
  }
  return NULL;
}

static void append(YNode *parent, YPair **last, YPair *p) {
  if (*last) (*last)->next = p;
  else parent->first = p;
  *last = p;
}

/* Adds a finished node to the collection on top of the stack (or makes it the root). */
static bool add_node(Builder *b, YNode *n, Loc at) {
  if (b->depth == 0) {
    b->root = n;
    return true;
  }
  Frame *f = &b->stack[b->depth - 1];
  YNode *parent = f->node;
  if (parent->kind == Y_MAP && !f->key) {
    if (n->kind != Y_SCALAR)
      return diag_error(b->d, at, "a mapping key must be a plain name; expected 'key: value'");
    const YNode *first = mem_map_get(&b->keys, parent, n->str);
    if (first)
      return diag_error(b->d, at, "duplicate key '%s' (first given at line %d); expected each key once",
                        n->str, first->loc.line + 1);
    mem_map_put(b->m, &b->keys, parent, n->str, n);
    f->key = n;
    return true;
  }
  YPair *p = mem_alloc(b->m, sizeof *p);
  p->key = f->key;
  p->val = n;
  f->key = NULL;
  append(parent, &f->last, p);
  parent->weight += n->weight;
  if (parent->weight > YAML_MAX_EXPANDED)
    return diag_error(b->d, at,
                      "document expands to more than %d nodes (an alias bomb?); expected a spec "
                      "of at most a few hundred keys",
                      YAML_MAX_EXPANDED);
  return true;
}

static void add_anchor(Builder *b, const char *name, YNode *n) {
  if (name) mem_map_put(b->m, &b->anchors, NULL, name, n);
}

static const char *dup_anchor(Builder *b, yaml_char_t *a) {
  return a ? mem_strdup(b->m, (const char *)a) : NULL;
}

/* Bytes libyaml would accept but a spec never contains: NUL and other control bytes, and
 * tabs in indentation (YAML indents with spaces only). */
static bool precheck(Builder *b) {
  const Source *s = b->src;
  int line = 0, col = 0;
  bool indent = true;
  for (size_t i = 0; i < s->len; i++) {
    unsigned char c = (unsigned char)s->text[i];
    Loc at = {s, line, col};
    int br = diag_line_break(s->text + i, s->text + s->len);
    if (br) {
      line++, col = 0, indent = true;
      i += (size_t)br - 1;
      continue;
    }
    if (c == '\t' && indent)
      return diag_error(b->d, at, "tab character in indentation; expected spaces (YAML "
                                  "does not allow tabs for indentation)");
    if (c < 0x20 && c != '\t')
      return diag_error(b->d, at, "control byte 0x%02x: this looks like a binary file; "
                                  "expected a UTF-8 YAML text", c);
    if (c != ' ' && c != '\t') indent = false;
    if ((c & 0xC0) != 0x80) col++;
  }
  return true;
}

static yaml_char_t *event_tag(const yaml_event_t *ev) {
  switch (ev->type) {
  case YAML_SCALAR_EVENT: return ev->data.scalar.tag;
  case YAML_SEQUENCE_START_EVENT: return ev->data.sequence_start.tag;
  case YAML_MAPPING_START_EVENT: return ev->data.mapping_start.tag;
  default: return NULL;
  }
}

static bool on_event(Builder *b, yaml_event_t *ev, int *docs) {
  Loc at = mark_loc(b->src, ev->start_mark);
  if (event_tag(ev))
    return diag_error(b->d, at, "YAML tag '%s': specs do not use tags; expected a plain value",
                      (const char *)event_tag(ev));
  switch (ev->type) {
  case YAML_DOCUMENT_START_EVENT:
    if (++*docs > 1)
      return diag_error(b->d, at, "a second YAML document; expected one spec per file");
    return true;
  case YAML_SCALAR_EVENT: {
    YNode *n = new_node(b->m, Y_SCALAR, at);
    n->str = mem_strndup(b->m, (const char *)ev->data.scalar.value, ev->data.scalar.length);
    if (strlen(n->str) != ev->data.scalar.length)
      return diag_error(b->d, at, "a NUL character in a value; expected text");
    n->quoted = ev->data.scalar.style != YAML_PLAIN_SCALAR_STYLE;
    add_anchor(b, dup_anchor(b, ev->data.scalar.anchor), n);
    return add_node(b, n, at);
  }
  case YAML_SEQUENCE_START_EVENT:
  case YAML_MAPPING_START_EVENT: {
    if (b->depth == YAML_MAX_DEPTH)
      return diag_error(b->d, at, "nesting deeper than %d levels; expected a spec of a few "
                                  "nested sections", YAML_MAX_DEPTH);
    bool map = ev->type == YAML_MAPPING_START_EVENT;
    YNode *n = new_node(b->m, map ? Y_MAP : Y_SEQ, at);
    yaml_char_t *anchor = map ? ev->data.mapping_start.anchor : ev->data.sequence_start.anchor;
    b->stack[b->depth++] = (Frame){n, NULL, NULL, dup_anchor(b, anchor)};
    return true;
  }
  case YAML_SEQUENCE_END_EVENT:
  case YAML_MAPPING_END_EVENT: {
    Frame f = b->stack[--b->depth];
    add_anchor(b, f.anchor, f.node); /* only now: an alias inside its anchor is unknown */
    return add_node(b, f.node, f.node->loc);
  }
  case YAML_ALIAS_EVENT: {
    const char *name = (const char *)ev->data.alias.anchor;
    const YNode *a = mem_map_get(&b->anchors, NULL, name);
    if (a) { /* shallow copy: errors point at the alias */
      YNode *n = new_node(b->m, a->kind, at);
      *n = *a;
      n->loc = at;
      return add_node(b, n, at);
    }
    return diag_error(b->d, at, "alias '*%s' names no complete anchor before it; expected "
                                "'&%s' defined earlier (and not around the alias)", name, name);
  }
  default:
    return true;
  }
}

/* libyaml's problems, and what to write instead. */
static const char *syntax_expectation(const char *problem) {
  static const char *const table[][2] = {
      {"expected ',' or ']'", "expected ',' between items or a closing ']'"},
      {"expected ',' or '}'", "expected ',' between entries or a closing '}'"},
      {"unexpected end of stream", "expected the closing quote"},
      {"mapping values are not allowed", "expected 'key: value' with a space after ':', and keys of a section indented alike"},
      {"did not find expected key", "expected the keys of a section indented alike"},
      {"cannot start any token", "expected a value; quote values that start with @ or `"},
  };
  for (size_t i = 0; i < sizeof table / sizeof table[0]; i++)
    if (strstr(problem, table[i][0])) return table[i][1];
  return "expected 'key: value' lines indented with spaces";
}

/* A line up to `last` that starts "key:value" with no space after the colon: libyaml reads
 * it as one scalar and complains a line later. Returns its colon's location, or line -1. */
static Loc missing_space(const Source *src, int last) {
  Loc found = {src, -1, 0};
  const char *p = src->text, *end = src->text + src->len;
  for (int line = 0; line <= last && p < end; line++) {
    const char *q = p;
    while (q < end && *q == ' ') q++;
    const char *k = q;
    while (q < end && ((*q >= 'a' && *q <= 'z') || (*q >= 'A' && *q <= 'Z') || *q == '_' || (q > k && *q >= '0' && *q <= '9'))) q++;
    if (q > k && q + 1 < end && *q == ':' && q[1] != ' ' && q[1] != '\n' && q[1] != '\r' && q[1] != '\t')
      found = (Loc){src, line, (int)(q - p)};
    while (p < end && !diag_line_break(p, end)) p++;
    if (p < end) p += diag_line_break(p, end);
  }
  return found;
}

YNode *yaml_parse(Mem *m, Diag *d, const Source *src, const char *what) {
  Builder b = {.m = m, .d = d, .src = src};
  if (!precheck(&b)) return NULL;
  yaml_parser_t parser;
  if (!yaml_parser_initialize(&parser)) {
    diag_error(d, (Loc){0}, "cannot initialize the YAML parser (out of memory)");
    return NULL;
  }
  yaml_parser_set_input_string(&parser, (const unsigned char *)src->text, src->len);
  int docs = 0;
  bool ok = true, done = false;
  while (ok && !done) {
    yaml_event_t ev;
    if (!yaml_parser_parse(&parser, &ev)) {
      const char *problem = parser.problem ? parser.problem : "malformed input";
      Loc at;
      if (parser.error == YAML_READER_ERROR) { /* encoding: the mark is not set, the offset is */
        at = offset_loc(src, parser.problem_offset);
        diag_error(d, at, "%s (byte 0x%02x); expected UTF-8 text", problem,
                   parser.problem_offset < src->len ? (unsigned char)src->text[parser.problem_offset] : 0);
      } else if ((at = missing_space(src, (int)parser.problem_mark.line)).line >= 0) {
        diag_error(d, at, "no space after ':'; expected 'key: value'");
      } else if (parser.context) { /* at the end of the file, show where the construct began */
        bool eof = parser.problem_mark.index >= src->len;
        diag_error(d, mark_loc(src, eof ? parser.context_mark : parser.problem_mark),
                   "YAML syntax: %s %s started at line %d, "
                   "column %d; %s", problem, parser.context, (int)parser.context_mark.line + 1,
                   (int)parser.context_mark.column + 1, syntax_expectation(problem));
      } else {
        diag_error(d, mark_loc(src, parser.problem_mark), "YAML syntax: %s; %s", problem,
                   syntax_expectation(problem));
      }
      ok = false;
      break;
    }
    done = ev.type == YAML_STREAM_END_EVENT;
    ok = on_event(&b, &ev, &docs);
    yaml_event_delete(&ev);
  }
  yaml_parser_delete(&parser);
  if (!ok) return NULL;
  Loc start = {src, 0, 0};
  if (!b.root || (b.root->kind == Y_SCALAR && b.root->str[0] == '\0' && !b.root->quoted)) {
    diag_error(d, start, "the file is empty; expected %s", what);
    return NULL;
  }
  if (b.root->kind != Y_MAP) {
    diag_error(d, b.root->loc, "the top level is a %s; expected %s",
               b.root->kind == Y_SEQ ? "sequence" : "scalar", what);
    return NULL;
  }
  return b.root;
}

static YNode *scalar(Mem *m, Loc loc, const char *str) {
  YNode *n = new_node(m, Y_SCALAR, loc);
  n->str = str;
  return n;
}

/* Adds key: val at the end of map. */
static YPair *map_append(Mem *m, YNode *map, YNode *key, YNode *val) {
  YPair *p = mem_alloc(m, sizeof *p);
  p->key = key, p->val = val;
  YPair **tail = &map->first;
  while (*tail) tail = &(*tail)->next;
  return *tail = p;
}

/* Sets the key src->text[0, klen) (dotted) to the scalar src->text[voff, voff + vlen), walking
 * and creating mappings along it; the value null or ~ removes the key instead (a key not
 * written is left so). The new nodes' marks point into src. */
static bool set_in(Mem *m, Diag *d, YNode *root, const Source *src, size_t klen, size_t voff, size_t vlen) {
  const char *text = src->text, *eq = text + klen;
  char *val = mem_strndup(m, text + voff, vlen);
  bool unset = strcmp(val, "null") == 0 || strcmp(val, "~") == 0;
  if (eq[-1] == '.')
    return diag_error(d, (Loc){src, 0, (int)klen}, "empty key segment; expected a "
                      "dotted key such as cluster.nodes");
  YNode *map = root;
  for (const char *p = text; p < eq;) {
    const char *dot = memchr(p, '.', (size_t)(eq - p));
    const char *end = dot ? dot : eq;
    Loc kl = {src, 0, (int)(p - text)};
    if (end == p)
      return diag_error(d, kl, "empty key segment; expected a dotted key such as "
                               "cluster.nodes");
    char *seg = mem_strndup(m, p, (size_t)(end - p));
    YPair *pair = yaml_pair(map, seg);
    if (!dot) { /* the last segment: set (or remove) the scalar */
      YNode *v = scalar(m, (Loc){src, 0, (int)voff}, val);
      if (pair && pair->val->kind != Y_SCALAR)
        return diag_error(d, kl, "'%.*s' is a %s in the spec; expected %s on a key with "
                          "one value", (int)klen, text, pair->val->kind == Y_MAP ? "section" : "sequence", src->name);
      if (unset) {
        for (YPair **pp = &map->first; *pp; pp = &(*pp)->next)
          if (*pp == pair) {
            *pp = pair->next;
            break;
          }
      } else if (pair) pair->val = v, pair->key = scalar(m, kl, seg);
      else map_append(m, map, scalar(m, kl, seg), v);
      return true;
    }
    if (pair && pair->val->kind == Y_SCALAR && pair->val->str[0] == '\0' && !pair->val->quoted)
      pair->val = new_node(m, Y_MAP, kl); /* "plan:" with no value is an empty section */
    if (pair && pair->val->kind != Y_MAP)
      return diag_error(d, kl, "'%s' is not a section; expected a dotted key through sections",
                        seg);
    if (!pair && unset) return true; /* nothing written there to remove */
    if (!pair) pair = map_append(m, map, scalar(m, kl, seg), new_node(m, Y_MAP, kl));
    map = pair->val;
    p = end + 1;
  }
  return true;
}

bool yaml_set(Mem *m, Diag *d, YNode *root, const char *arg) {
  const Source *src = diag_source(m, "--set", arg, strlen(arg));
  const char *eq = strchr(src->text, '=');
  Loc at = {src, 0, 0};
  if (!eq || eq == src->text)
    return diag_error(d, at, "--set needs KEY=VALUE; expected e.g. --set training.seq_len=32768");
  const char *val = eq + 1;
  while (*val == ' ') val++;
  if (!*val)
    return diag_error(d, (Loc){src, 0, (int)(val - src->text)},
                      "--set %.*s has no value; expected KEY=VALUE (or KEY=null to remove the key)",
                      (int)(eq - src->text), src->text);
  return set_in(m, d, root, src, (size_t)(eq - src->text), (size_t)(val - src->text), strlen(val));
}

bool yaml_set_over(Mem *m, Diag *d, YNode *root, const char *arg, int index) {
  const Source *src = diag_source(m, "--over", arg, strlen(arg));
  const char *eq = strchr(src->text, '='), *p = eq ? eq + 1 : NULL;
  for (int i = 0; p && i < index; i++) p = strchr(p, ','), p = p ? p + 1 : NULL;
  if (!eq || eq == src->text || !p) /* (sweep.c checked the form) */
    return diag_error(d, (Loc){src, 0, 0}, "--over '%s' has no value %d; expected KEY=V1,V2,...", arg, index + 1);
  const char *comma = strchr(p, ',');
  size_t len = comma ? (size_t)(comma - p) : strlen(p);
  return set_in(m, d, root, src, (size_t)(eq - src->text), (size_t)(p - src->text), len);
}

void yaml_merge_under(Mem *m, YNode *dst, const YNode *src) {
  if (dst->kind != Y_MAP || src->kind != Y_MAP) return;
  for (YPair *s = src->first; s; s = s->next) {
    YPair *p = yaml_pair(dst, s->key->str);
    if (p) {
      if (p->val->kind == Y_MAP && s->val->kind == Y_MAP) yaml_merge_under(m, p->val, s->val);
      continue;
    }
    map_append(m, dst, s->key, s->val);
  }
}
