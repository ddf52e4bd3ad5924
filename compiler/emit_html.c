/* emit_html.c — report.html: one self-contained page (no scripts, no network) with the plan's
 * summary, the memory picture and the whole plan text (model accounting, memory tables,
 * schedule, predicted breakdown, rejected alternatives). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mtc.h"

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
  const Candidate *c = &p->best;
  fputs("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>", f);
  emit_escape(f, s->name, strlen(s->name));
  fputs(" — mtc plan</title>\n<style>body{font-family:sans-serif;margin:2em;max-width:1100px;color:#222}"
        "pre{font-size:12px;background:#f6f6f6;padding:1em;overflow-x:auto}"
        ".big{font-size:20px}.bad{color:#b00}td,th{padding:2px 12px;text-align:left}</style></head><body>\n", f);
  fputs("<h1>", f);
  emit_escape(f, s->name, strlen(s->name));
  fputs("</h1>\n", f);
  if (p->feasible) {
    fprintf(f, "<p class=\"big\">%lld GPUs, fsdp %lld &times; dp %lld, ep %lld, %s checkpointing%s: "
               "<b>%.1f s</b> per step, <b>%.0f</b> tokens/s per GPU, MFU <b>%.1f%%</b>; bottleneck: %s</p>\n",
            (long long)p->world, (long long)c->ch.fsdp, (long long)c->ch.dp_replicate, (long long)c->ch.ep,
            plan_ac_words(c->ch.ac), c->ch.offload == OFF_HOST ? ", boundaries on host" :
                                    c->ch.offload == OFF_NVME ? ", boundaries on NVMe" : "",
            c->cost.step, c->cost.tokens_per_s_per_gpu, 100 * c->cost.mfu, c->cost.bottleneck);
    Mem pm = {0}; /* where the prediction comes from (report_provenance) */
    const char *prov = report_provenance(&pm, s, true);
    fputs("<p class=\"prov\">Where this prediction comes from: ", f);
    emit_escape(f, prov, strlen(prov));
    fputs(" (the plan text below has the whole account).</p>\n", f);
    mem_free(&pm);
    fputs("<table><tr><th>component</th><th>seconds per step</th></tr>\n", f);
    const Cost *k = &c->cost;
    const char *names[] = {"compute", "exposed FSDP communication", "MoE all-to-all", "exposed activation offload",
                           "host gradient accumulation", "optimizer step", "data-parallel all-reduce"};
    double vals[] = {k->compute, k->exposed_comm, k->a2a, k->exposed_offload, k->host_grad, k->optimizer,
                     k->dp_allreduce};
    for (int i = 0; i < 7; i++) fprintf(f, "<tr><td>%s</td><td>%.3f</td></tr>\n", names[i], vals[i]);
    fputs("</table>\n", f);
  } else {
    fputs("<p class=\"big bad\">No plan fits. ", f);
    if (p->advice) emit_escape(f, p->advice, strlen(p->advice));
    fputs("</p>\n", f);
  }
  fputs("<h2>Memory per GPU</h2>\n", f);
  emit_memory_svg_to(f, p);
  fputs("<h2>The plan</h2>\n<pre>", f);
  emit_escape(f, text, len);
  fputs("</pre>\n<p>Written by mtc " MTC_VERSION ". The predicted step is in timeline.json "
        "(open it in Perfetto or chrome://tracing).</p>\n</body></html>\n", f);
  free(text);
  return out_close(d, &o);
}
