/* emit_html.c — report.html: one self-contained page (no scripts, no network) with the plan's
 * headline and time table, the predicted step as a timeline (the whole step, and the first
 * micro-batch layer by layer), memory per tier over the step, the layout drawn, and the whole
 * plan text (model accounting, memory tables, schedule, predicted breakdown, alternatives). */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mtc.h"

const char *emit_html_style =
    "body{font-family:sans-serif;margin:2em;max-width:1100px;color:#222}"
    "pre{font-size:12px;background:#f6f6f6;padding:1em;overflow-x:auto}"
    ".big{font-size:20px}.bad{color:#b00}td,th{padding:2px 12px;text-align:left}"
    ".scroll{overflow-x:auto;border:1px solid #eee}.pair{display:flex;gap:1em}.pair>div{flex:1;min-width:0}";

/* The headline (layout, step time, throughput, MFU, bottleneck) and the time table; on an
 * infeasible plan, what would make it fit. */
void emit_html_headline(FILE *f, const Plan *p) {
  const Candidate *c = &p->best;
  if (!p->feasible) {
    fputs("<p class=\"big bad\" id=\"headline\">No plan fits. ", f);
    if (p->advice) emit_escape(f, p->advice, strlen(p->advice));
    fputs("</p>\n", f);
    return;
  }
  fprintf(f, "<p class=\"big\" id=\"headline\">%lld GPUs, fsdp %lld &times; dp %lld, ep %lld, %s checkpointing%s: "
             "<b>%.1f s</b> per step, <b>%.0f</b> tokens/s per GPU, MFU <b>%.1f%%</b>; bottleneck: %s</p>\n",
          (long long)p->world, (long long)c->ch.fsdp, (long long)c->ch.dp_replicate, (long long)c->ch.ep,
          plan_ac_words(c->ch.ac), c->ch.offload == OFF_HOST ? ", boundaries on host" :
                                  c->ch.offload == OFF_NVME ? ", boundaries on NVMe" : "",
          c->cost.step, c->cost.tokens_per_s_per_gpu, 100 * c->cost.mfu, c->cost.bottleneck);
  Mem pm = {0}; /* where the prediction comes from (report_provenance) */
  const char *prov = report_provenance(&pm, p->md->spec, true);
  fputs("<p class=\"prov\">Where this prediction comes from: ", f);
  emit_escape(f, prov, strlen(prov));
  fputs(" (the plan text below has the whole account).</p>\n", f);
  mem_free(&pm);
  fputs("<table id=\"times\"><tr><th>component</th><th>seconds per step</th></tr>\n", f);
  const Cost *k = &c->cost;
  const char *names[] = {"compute", "exposed FSDP communication", "MoE all-to-all", "context-parallel K/V exchange",
                         "exposed activation offload", "host gradient accumulation", "optimizer step",
                         "data-parallel all-reduce"};
  double vals[] = {k->compute, k->exposed_comm, k->a2a, k->cp_exchange, k->exposed_offload, k->host_grad,
                   k->optimizer, k->dp_allreduce};
  for (int i = 0; i < 8; i++) /* (the K/V exchange only under context parallelism) */
    if (i != 3 || vals[i] > 0) fprintf(f, "<tr><td>%s</td><td>%.3f</td></tr>\n", names[i], vals[i]);
  fputs("</table>\n", f);
}

/* Pixels per second of the first micro-batch's layer-by-layer view: at least 14 px per layer
 * and pass, and at least width px in all. */
double emit_html_layer_scale(const Plan *p, double span, double width) {
  double px = width / span, per_layer = 14.0 * 2 * p->md->nlayers / span;
  return px > per_layer ? px : per_layer;
}

bool emit_report_html(Diag *d, const Plan *p, const char *path) {
  char *text = NULL;
  size_t len = 0;
  FILE *mf = open_memstream(&text, &len);
  if (!mf) return diag_error(d, (Loc){0}, "out of memory writing '%s'", path);
  report_text(mf, p->md);
  report_plan_text(mf, p, false);
  fclose(mf);
  OutFile o;
  FILE *f = out_open(d, &o, path);
  if (!f) {
    free(text);
    return false;
  }
  const Spec *s = p->md->spec;
  fputs("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>", f);
  emit_escape(f, s->name, strlen(s->name));
  fprintf(f, " — mtc plan</title>\n<style>%s</style></head><body>\n<h1>", emit_html_style);
  emit_escape(f, s->name, strlen(s->name));
  fputs("</h1>\n", f);
  emit_html_headline(f, p);
  if (p->feasible) {
    json_t *events = emit_step_events(p);
    double step = emit_step_span(events, false), micro = emit_step_span(events, true);
    fputs("<h2>The predicted step</h2>\n<p>Every stream of the cost model's simulation (the events of timeline.json; "
          "open that in Perfetto or chrome://tracing to zoom). The first micro-batch is drawn layer by layer, the "
          "others as one slice per stream. Hover a slice for its name, layer and time.</p>\n<div class=\"scroll\">", f);
    emit_steps_svg_to(f, p, events, "timeline-step", false, step, 840 / step);
    fputs("</div>\n<h3>The first micro-batch, layer by layer</h3>\n<div class=\"scroll\">", f);
    emit_steps_svg_to(f, p, events, "timeline-layers", true, micro, emit_html_layer_scale(p, micro, 840));
    fputs("</div>\n", f);
    json_decref(events);
  }
  fputs("<h2>Memory per GPU</h2>\n", f);
  emit_memory_svg_to(f, p, NULL);
  if (p->feasible) {
    fputs("<h2>The layout</h2>\n<div class=\"scroll\">", f);
    emit_ranks_svg_to(f, p, "layout");
    fputs("</div>\n", f);
  }
  fputs("<h2>The plan</h2>\n<pre id=\"plan\">", f);
  emit_escape(f, text, len);
  fputs("</pre>\n<p>Written by mtc " MTC_VERSION ". The predicted step is in timeline.json "
        "(open it in Perfetto or chrome://tracing).</p>\n</body></html>\n", f);
  free(text);
  return out_close(d, &o);
}
