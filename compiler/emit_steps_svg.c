/* emit_steps_svg.c — the predicted step as an SVG timeline for report.html and `mtc diff --html`:
 * one lane per stream of the cost model's own simulation (cost_step_trace, the events
 * timeline.json holds), a layer's compute coloured by category (attention, experts or MLP,
 * recompute, the rest), all-gathers and reduce-scatters apart, with a time axis in seconds and
 * layer marks. No script: the slices of the layer-by-layer view, and those without a layer,
 * carry their name, layer and duration in a <title> (a tooltip). */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "mtc.h"

enum { LABEL_W = 190, LANE_H = 22, LANE_GAP = 6, TOP = 34 };

json_t *emit_step_events(const Plan *p) {
  json_t *events = json_array();
  Candidate c = p->best;
  if (p->feasible) cost_step_trace(p->md, &c, events);
  return events;
}

/* What a slice is, for its colour and the legend (ORDER the two tables). */
typedef enum { K_ATTN, K_EXPERTS, K_MLP, K_RECOMPUTE, K_OTHER, K_EDGE, K_REST, K_AG, K_RS, K_A2A, K_KV, K_D2H, K_H2D,
               K_OPT, K__COUNT } Kind;
static const char *const kind_color[K__COUNT] = {"#4e79a7", "#f28e2b", "#edc948", "#b07aa1", "#bab0ac", "#9c755f",
                                                  "#d7d7d7", "#59a14f", "#8cd17d", "#e15759", "#ff9da7", "#76b7b2",
                                                  "#a0cbe8", "#499894"};
static const char *const kind_name[K__COUNT] = {
    "attention", "experts (router, routed, shared)", "MLP", "recompute", "norms, residuals",
    "embedding, LM head, loss", "later micro-batches", "all-gather", "reduce-scatter", "MoE all-to-all",
    "K/V exchange", "to host or NVMe (boundaries, gradients)", "boundaries back", "optimizer"};

static Kind kind_of(json_t *e) {
  int tid = (int)json_integer_value(json_object_get(e, "tid"));
  const char *cat = json_string_value(json_object_get(e, "cat")), *name = json_string_value(json_object_get(e, "name"));
  bool layer = json_object_get(json_object_get(e, "args"), "layer") != NULL;
  cat = cat ? cat : "", name = name ? name : "";
  switch (tid) {
  case TR_COMPUTE:
    if (!layer) return strncmp(name, "micro-batches", 13) ? K_EDGE : K_REST;
    return !strcmp(cat, "attention") ? K_ATTN : !strcmp(cat, "experts") ? K_EXPERTS : !strcmp(cat, "mlp") ? K_MLP
         : !strcmp(cat, "recompute") ? K_RECOMPUTE : K_OTHER;
  case TR_COMM:
    return !layer && !strncmp(name, "micro-batches", 13) ? K_REST : strstr(name, "reduce-scatter") ? K_RS : K_AG;
  case TR_A2A: return layer ? K_A2A : K_REST;
  case TR_CP: return layer ? K_KV : K_REST;
  case TR_D2H: return K_D2H;
  case TR_H2D: return K_H2D;
  default: return K_OPT;
  }
}

/* Whether e is drawn in a view of the first micro-batch ending at span seconds (first_micro): the
 * slices that start before it ends. */
static bool in_view(json_t *e, bool first_micro, double span) {
  return !first_micro || json_number_value(json_object_get(e, "ts")) / 1e6 < span * (1 - 1e-9);
}

double emit_step_span(json_t *events, bool first_micro) {
  double end = 0;
  size_t i;
  json_t *e;
  json_array_foreach(events, i, e) {
    if (first_micro && !json_object_get(json_object_get(e, "args"), "layer")) continue;
    double x = (json_number_value(json_object_get(e, "ts")) + json_number_value(json_object_get(e, "dur"))) / 1e6;
    if (x > end) end = x;
  }
  return end;
}

void emit_steps_svg_to(FILE *f, const Plan *p, json_t *events, const char *id, bool first_micro, double span,
                       double px_per_s) {
  bool used[TR__COUNT] = {false}, kinds[K__COUNT] = {false};
  size_t i;
  json_t *e;
  json_array_foreach(events, i, e) {
    int tid = (int)json_integer_value(json_object_get(e, "tid"));
    if (tid < 0 || tid >= TR__COUNT || strcmp(json_string_value(json_object_get(e, "ph")), "X")) continue;
    if (!in_view(e, first_micro, span)) continue;
    used[tid] = true, kinds[kind_of(e)] = true;
  }
  int lane[TR__COUNT], nlanes = 0;
  for (int t = 0; t < TR__COUNT; t++) lane[t] = used[t] ? nlanes++ : -1;
  int plot_w = (int)ceil(span * px_per_s), w = LABEL_W + plot_w + 20 > 940 ? LABEL_W + plot_w + 20 : 940;
  int legend_y = TOP + nlanes * (LANE_H + LANE_GAP) + 44, h = legend_y + 16 * ((K__COUNT + 3) / 4) + 8;
  fprintf(f, "<svg xmlns=\"http://www.w3.org/2000/svg\" id=\"%s\" class=\"timeline\" width=\"%d\" height=\"%d\" "
             "viewBox=\"0 0 %d %d\" data-seconds=\"%.6f\">\n", id, w, h, w, h, span);
  fprintf(f, "<style>.timeline text{font-family:sans-serif;font-size:12px;fill:#222}.timeline .s{font-size:10px}"
             ".timeline .grid{stroke:#e4e4e4}.timeline .mark{stroke:#555}");
  for (int k = 0; k < K__COUNT; k++) fprintf(f, ".timeline .k%d{fill:%s}", k, kind_color[k]);
  fprintf(f, "</style>\n<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n");
  /* time axis */
  double step = emit_axis_step(span, 10);
  for (double t = 0; t <= span * (1 + 1e-9); t += step) {
    double x = LABEL_W + t * px_per_s;
    fprintf(f, "<line x1=\"%.1f\" y1=\"%d\" x2=\"%.1f\" y2=\"%d\" class=\"grid\"/><text x=\"%.1f\" y=\"%d\" "
               "class=\"s\" text-anchor=\"middle\">%g s</text>\n", x, TOP - 4, x, TOP + nlanes * (LANE_H + LANE_GAP),
            x, TOP - 8, t);
  }
  for (int t = 0; t < TR__COUNT; t++)
    if (lane[t] >= 0) {
      fprintf(f, "<text x=\"8\" y=\"%d\" data-track=\"%d\">", TOP + lane[t] * (LANE_H + LANE_GAP) + 15, t);
      emit_escape(f, cost_track_names[t], strlen(cost_track_names[t]));
      fputs("</text>\n", f);
    }
  /* slices: on the compute and FSDP lanes those narrower than a fifth of a pixel are left out of
   * the picture (not of the trace); on the other lanes each is at least a pixel wide */
  int L = p->md->nlayers, stride = emit_layer_stride(L);
  int marks_y = TOP + nlanes * (LANE_H + LANE_GAP) + 14;
  double last_mark = -1e9; /* x of the last layer mark (the compute slices come in time order) */
  json_array_foreach(events, i, e) {
    int tid = (int)json_integer_value(json_object_get(e, "tid"));
    if (tid < 0 || tid >= TR__COUNT || lane[tid] < 0 || strcmp(json_string_value(json_object_get(e, "ph")), "X"))
      continue;
    json_t *layer = json_object_get(json_object_get(e, "args"), "layer");
    if (!in_view(e, first_micro, span)) continue;
    double ts = json_number_value(json_object_get(e, "ts")) / 1e6, dur = json_number_value(json_object_get(e, "dur")) / 1e6;
    Kind k = kind_of(e);
    double x = LABEL_W + ts * px_per_s, wd = dur * px_per_s;
    /* a mark under every stride-th layer's attention, forward and backward, where it has room */
    if (layer && k == K_ATTN && json_integer_value(layer) % stride == 0 && x - last_mark >= 18) {
      fprintf(f, "<line x1=\"%.1f\" y1=\"%d\" x2=\"%.1f\" y2=\"%d\" class=\"mark\"/><text x=\"%.1f\" y=\"%d\" "
                 "class=\"s layer\" text-anchor=\"middle\">%lld</text>\n", x, marks_y - 12, x, marks_y - 8, x,
              marks_y + 2, (long long)json_integer_value(layer));
      last_mark = x;
    }
    if (wd < 0.2 && (tid == TR_COMPUTE || tid == TR_COMM)) continue; /* drawn by their neighbours */
    if (wd < 1) wd = 1; /* a copy or an all-to-all on its own lane stays visible */
    int y = TOP + lane[tid] * (LANE_H + LANE_GAP);
    fprintf(f, "<rect x=\"%.1f\" y=\"%d\" width=\"%.1f\" height=\"%d\" class=\"k%d\">", x, y, wd, LANE_H, (int)k);
    if (first_micro || !layer) { /* the whole step's layer slices are named in the layer view */
      const char *name = json_string_value(json_object_get(e, "name"));
      fputs("<title>", f);
      emit_escape(f, name, strlen(name));
      if (layer) fprintf(f, ", layer %lld", (long long)json_integer_value(layer));
      fprintf(f, ": %.3f ms from %.3f s</title>", dur * 1e3, ts);
    }
    fputs("</rect>\n", f);
  }
  fprintf(f, "<text x=\"8\" y=\"%d\" class=\"s\">layers (forward, then backward)</text>\n", marks_y + 2);
  int n = 0;
  for (int k = 0; k < K__COUNT; k++) {
    if (!kinds[k]) continue;
    int lx = 8 + (n % 4) * 230, ly = legend_y + (n / 4) * 16;
    fprintf(f, "<rect x=\"%d\" y=\"%d\" width=\"10\" height=\"10\" fill=\"%s\"/><text x=\"%d\" y=\"%d\" class=\"s\">%s"
               "</text>\n", lx, ly - 9, kind_color[k], lx + 14, ly, kind_name[k]);
    n++;
  }
  fprintf(f, "</svg>\n");
}
