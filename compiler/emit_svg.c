/* emit_svg.c — memory.svg: for each memory tier, the items alive at its fullest phase as one
 * stacked bar by category against the capacity line, and the tier's memory over the phases
 * of a step against an axis of GiB, with marks at the layers' forward and backward phases.
 * Deterministic (no dates, fixed number formats); every bar segment carries its bytes in
 * data-bytes so tools and tests can read the picture back. */
#include <stdio.h>
#include <string.h>

#include "mtc.h"

/* ORDER ItemCategory */
static const char *const cat_color[CAT__COUNT] = {"#4e79a7", "#a0cbe8", "#f28e2b", "#e15759",
                                                  "#59a14f", "#b07aa1", "#9c755f", "#bab0ac"};

enum { W = 960, BAR_X = 170, BAR_W = 700, TIER_H = 300 };

void emit_escape(FILE *f, const char *s, size_t n) {
  for (size_t i = 0; i < n; i++) {
    if (s[i] == '<') fputs("&lt;", f);
    else if (s[i] == '>') fputs("&gt;", f);
    else if (s[i] == '&') fputs("&amp;", f);
    else if (s[i] == '"') fputs("&quot;", f);
    else if ((unsigned char)s[i] < 0x20 && s[i] != '\n' && s[i] != '\t') fputs("&#xFFFD;", f); /* not XML */
    else fputc(s[i], f);
  }
}

static void esc(FILE *f, const char *s) { emit_escape(f, s, strlen(s)); }

double emit_axis_step(double span, double most) {
  double e = 1e-9;
  while (span / (10 * e) > most) e *= 10;
  for (;; e *= 10)
    for (int i = 0; i < 3; i++) {
      double step = (double[]){1, 2, 5}[i] * e;
      if (span / step <= most) return step;
    }
}

int emit_layer_stride(int L) {
  double k = emit_axis_step(L, 8);
  return k < 1 ? 1 : (int)k;
}

static void tier(FILE *f, Mem *m, const Plan *p, Tier t, int y0, double top) {
  const Candidate *c = &p->best;
  int L = p->md->nlayers, nphase = PHASE_END(L), peak = c->peak_phase[t];
  double scale_max = top > 0 ? top : 1;
  double sx = BAR_W / scale_max;
  char a[32], b[32];
  units_fmt_bytes_bin(a, sizeof a, (double)c->live_peak[t]);
  units_fmt_bytes_bin(b, sizeof b, (double)c->capacity[t]);
  fprintf(f, "<g class=\"tier\" data-tier=\"%s\" data-live-peak=\"%lld\" data-capacity=\"%lld\">\n",
          plan_tier_name(t), (long long)c->live_peak[t], (long long)c->capacity[t]);
  fprintf(f, "  <text x=\"20\" y=\"%d\" class=\"h\">%s: %s alive at the fullest phase of %s capacity</text>\n",
          y0 + 20, plan_tier_name(t), a, b);
  /* the bar: categories in their order, items of a category side by side */
  double x = BAR_X;
  int64_t by_cat[CAT__COUNT] = {0};
  for (int k = 0; k < CAT__COUNT; k++)
    for (int i = 0; i < c->nitems; i++) {
      const MemItem *it = &c->items[i];
      if (it->tier != t || it->cat != (ItemCategory)k || it->start > peak || it->end <= peak || !it->bytes) continue;
      double w = (double)it->bytes * sx;
      fprintf(f, "  <rect x=\"%.2f\" y=\"%d\" width=\"%.2f\" height=\"40\" fill=\"%s\" data-bytes=\"%lld\"><title>",
              x, y0 + 40, w, cat_color[k], (long long)it->bytes);
      esc(f, it->name);
      units_fmt_bytes_bin(a, sizeof a, (double)it->bytes);
      fprintf(f, ": %s</title></rect>\n", a);
      x += w;
      by_cat[k] += it->bytes;
    }
  double cap_x = BAR_X + (double)c->capacity[t] * sx;
  fprintf(f, "  <line x1=\"%.2f\" y1=\"%d\" x2=\"%.2f\" y2=\"%d\" class=\"cap\"/>\n", cap_x, y0 + 32, cap_x, y0 + 88);
  fprintf(f, "  <text x=\"%.2f\" y=\"%d\" class=\"s\" text-anchor=\"end\">capacity</text>\n", cap_x, y0 + 100);
  /* legend with category totals */
  int lx = 20, ly = y0 + 118;
  for (int k = 0; k < CAT__COUNT; k++) {
    if (!by_cat[k]) continue;
    units_fmt_bytes_bin(a, sizeof a, (double)by_cat[k]);
    fprintf(f, "  <rect x=\"%d\" y=\"%d\" width=\"10\" height=\"10\" fill=\"%s\"/><text x=\"%d\" y=\"%d\" class=\"s\">%s %s</text>\n",
            lx, ly - 9, cat_color[k], lx + 14, ly, plan_cat_name((ItemCategory)k), a);
    lx += 190;
    if (lx > W - 190) lx = 20, ly += 16;
  }
  /* memory over the step: live bytes per phase, against an axis of GiB and the layers' phases */
  int gy = ly + 20, gh = y0 + TIER_H - 34 - gy;
  int64_t *live = mem_array(m, (size_t)nphase + 1, sizeof *live);
  for (int i = 0; i < c->nitems; i++)
    if (c->items[i].tier == t) live[c->items[i].start] += c->items[i].bytes, live[c->items[i].end] -= c->items[i].bytes;
  double px_of = (double)BAR_W / (nphase > 1 ? nphase - 1 : 1), py = gh / scale_max;
  fprintf(f, "  <g class=\"axes\" data-tier=\"%s\">\n", plan_tier_name(t));
  fprintf(f, "  <text x=\"20\" y=\"%d\" class=\"s\">over the step</text>\n", gy + gh / 2);
  double step = emit_axis_step(scale_max / 1073741824.0, 5) * 1073741824.0; /* GiB */
  for (double v = 0; v <= scale_max * (1 + 1e-9); v += step) {
    double y = gy + gh - v * py;
    units_fmt_bytes_bin(a, sizeof a, v);
    fprintf(f, "  <line x1=\"%d\" y1=\"%.1f\" x2=\"%d\" y2=\"%.1f\" class=\"grid\"/><text x=\"%d\" y=\"%.1f\" "
               "class=\"s tick\" text-anchor=\"end\">%s</text>\n", BAR_X, y, BAR_X + BAR_W, y, BAR_X - 4, y + 4, a);
  }
  int stride = emit_layer_stride(L);
  for (int l = 0; l < L; l += stride)
    for (int pass = 0; pass < 2; pass++) {
      double lx2 = BAR_X + (pass ? PHASE_BWD(L, l) : PHASE_FWD(L, l)) * px_of;
      fprintf(f, "  <line x1=\"%.1f\" y1=\"%d\" x2=\"%.1f\" y2=\"%d\" class=\"mark\"/><text x=\"%.1f\" y=\"%d\" "
                 "class=\"s layer\" text-anchor=\"middle\">%d</text>\n", lx2, gy + gh, lx2, gy + gh + 4, lx2,
              gy + gh + 14, l);
    }
  fprintf(f, "  </g>\n");
  fprintf(f, "  <polyline class=\"mem\" points=\"");
  int64_t sum = 0;
  for (int ph = 0; ph < nphase; ph++) {
    sum += live[ph];
    fprintf(f, "%.1f,%.1f ", BAR_X + ph * px_of, gy + gh - (double)sum * py);
  }
  fprintf(f, "\"/>\n");
  double cy = gy + gh - (double)c->capacity[t] * py;
  fprintf(f, "  <line x1=\"%d\" y1=\"%.1f\" x2=\"%d\" y2=\"%.1f\" class=\"cap\"/>\n", BAR_X, cy, BAR_X + BAR_W, cy);
  fprintf(f, "  <text x=\"%d\" y=\"%d\" class=\"s\">layer: forward</text><text x=\"%.1f\" y=\"%d\" class=\"s\" "
             "text-anchor=\"middle\">loss</text><text x=\"%d\" y=\"%d\" class=\"s\" text-anchor=\"end\">backward, "
             "optimizer</text>\n", BAR_X, gy + gh + 28, BAR_X + PHASE_LOSS(L) * px_of, gy + gh + 28, BAR_X + BAR_W,
          gy + gh + 28);
  fprintf(f, "</g>\n");
}

MemScale emit_memory_scale(const Plan *p) {
  const Candidate *c = &p->best;
  MemScale sc = {{0}, {false}};
  for (int t = 0; t < TIER__COUNT; t++) {
    sc.shown[t] = c->nitems && c->live_peak[t] > 0;
    sc.top[t] = c->capacity[t] > c->live_peak[t] ? c->capacity[t] : c->live_peak[t];
  }
  return sc;
}

void emit_memory_svg_to(FILE *f, const Plan *p, const MemScale *scale) {
  MemScale own = emit_memory_scale(p);
  if (!scale) scale = &own;
  int tiers = 0;
  for (int t = 0; t < TIER__COUNT; t++) tiers += scale->shown[t];
  Mem m = {0};
  int h = 60 + TIER_H * (tiers ? tiers : 1);
  fprintf(f, "<svg xmlns=\"http://www.w3.org/2000/svg\" %sclass=\"memory\" width=\"%d\" height=\"%d\" "
             "viewBox=\"0 0 %d %d\">\n", scale == &own ? "id=\"memory\" " : "", W, h, W, h);
  /* (rules scoped to the picture: report.html holds several SVGs) */
  fprintf(f, "<style>.memory text{font-family:sans-serif;font-size:13px;fill:#222}.memory .h{font-size:15px;"
             "font-weight:bold}.memory .s{font-size:11px}.memory .cap{stroke:#d62728;stroke-width:2;"
             "stroke-dasharray:6 3}.memory .mem{fill:none;stroke:#4e79a7;stroke-width:2}.memory .grid{stroke:#ddd;"
             "stroke-width:1}.memory .mark{stroke:#888;stroke-width:1}</style>\n");
  fprintf(f, "<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n<text x=\"20\" y=\"30\" class=\"h\">");
  esc(f, p->md->spec->name);
  fprintf(f, ": memory per GPU (%s plan)</text>\n", p->feasible ? "feasible" : "infeasible");
  int y = 50;
  for (int t = 0; t < TIER__COUNT; t++)
    if (scale->shown[t]) tier(f, &m, p, (Tier)t, y, (double)scale->top[t]), y += TIER_H;
  fprintf(f, "</svg>\n");
  mem_free(&m);
}

bool emit_memory_svg(Diag *d, const Plan *p, const char *path) {
  OutFile o;
  FILE *f = out_open(d, &o, path);
  if (!f) return false;
  emit_memory_svg_to(f, p, NULL);
  return out_close(d, &o);
}
