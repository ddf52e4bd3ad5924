/* emit_ranks_svg.c — the plan's layout drawn for report.html: every node with its GPUs (global
 * rank g = replica × fsdp + r, nodes of gpus_per_node consecutive ranks), each GPU filled by its
 * EP group (ep consecutive ranks of an FSDP group), with its EP rank r % ep; a strip under it
 * by FSDP group (replica); context-parallel groups (cp consecutive ranks) joined by a line. */
#include <stdio.h>

#include "mtc.h"

enum { GPU = 18, GAP = 3, NODE_PAD = 5, MAX_NODES = 256, W = 940 };

static const char *const palette[] = {"#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f",
                                      "#edc948", "#b07aa1", "#ff9da7", "#9c755f", "#bab0ac"};
enum { NPAL = sizeof palette / sizeof *palette };

void emit_ranks_svg_to(FILE *f, const Plan *p, const char *id) {
  const Spec *s = p->md->spec;
  const Choice *ch = &p->best.ch;
  int64_t gpn = s->cluster.gpus_per_node, nodes = (p->world + gpn - 1) / gpn, fsdp = ch->fsdp, ep = ch->ep;
  int64_t cp = plan_cp(ch), shown = nodes < MAX_NODES ? nodes : MAX_NODES;
  int node_w = (int)(gpn * (GPU + GAP) - GAP + 2 * NODE_PAD), node_h = GPU + 2 * NODE_PAD + 18;
  int per_row = (W - 20) / (node_w + 8);
  if (per_row < 1) per_row = 1;
  int rows = (int)((shown + per_row - 1) / per_row), h = 66 + rows * (node_h + 8) + (shown < nodes ? 18 : 0);
  fprintf(f, "<svg xmlns=\"http://www.w3.org/2000/svg\" id=\"%s\" class=\"ranks\" width=\"%d\" height=\"%d\" "
             "viewBox=\"0 0 %d %d\" data-nodes=\"%lld\" data-gpus=\"%lld\">\n", id, W, h, W, h, (long long)nodes,
          (long long)(nodes * gpn));
  fprintf(f, "<style>.ranks text{font-family:sans-serif;font-size:12px;fill:#222}.ranks .s{font-size:9px}"
             ".ranks .node{fill:#f4f4f4;stroke:#999}.ranks .cp{stroke:#222;stroke-width:2}.ranks .g{font-size:9px;"
             "fill:white;text-anchor:middle}</style>\n<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n");
  fprintf(f, "<text x=\"10\" y=\"18\">%lld nodes &#215; %lld GPUs: FSDP groups of %lld ranks (%lld replica%s, the strip "
             "under each GPU)%s", (long long)nodes, (long long)gpn, (long long)fsdp, (long long)ch->dp_replicate,
          ch->dp_replicate == 1 ? "" : "s", ep > 1 ? "" : "; no expert parallelism");
  if (ep > 1) fprintf(f, "; EP groups of %lld consecutive ranks (fill), each expert sharded over %lld ranks",
                      (long long)ep, (long long)ch->efsdp);
  fprintf(f, "</text>\n<text x=\"10\" y=\"34\">the number in a GPU is its EP rank%s</text>\n",
          cp > 1 ? "; context parallelism: the ranks joined by a black line split each sequence" : "");
  for (int64_t n = 0; n < shown; n++) {
    int x0 = 10 + (int)(n % per_row) * (node_w + 8), y0 = 46 + (int)(n / per_row) * (node_h + 8);
    fprintf(f, "<g data-node=\"%lld\"><rect class=\"node\" x=\"%d\" y=\"%d\" width=\"%d\" height=\"%d\" "
               "rx=\"3\"/><text x=\"%d\" y=\"%d\" class=\"s\">node %lld</text>\n",
            (long long)n, x0, y0, node_w, node_h, x0 + NODE_PAD, y0 + node_h - 5, (long long)n);
    for (int64_t j = 0; j < gpn; j++) {
      int64_t g = n * gpn + j, r = g % fsdp, replica = g / fsdp, group = ep > 1 ? g / ep : replica;
      int x = x0 + NODE_PAD + (int)j * (GPU + GAP), y = y0 + NODE_PAD;
      fprintf(f, "<rect class=\"gpu\" x=\"%d\" y=\"%d\" width=\"%d\" height=\"%d\" fill=\"%s\"><title>rank %lld: "
                 "FSDP %lld rank %lld, EP rank %lld", x, y, GPU, GPU, palette[group % NPAL], (long long)g,
              (long long)replica, (long long)r, (long long)(r % ep));
      if (cp > 1) fprintf(f, ", CP group %lld", (long long)(g / cp));
      fprintf(f, "</title></rect><rect x=\"%d\" y=\"%d\" width=\"%d\" height=\"3\" fill=\"%s\"/>"
                 "<text x=\"%d\" y=\"%d\" class=\"g\">%lld</text>\n",
              x, y + GPU + 1, GPU, palette[(replica + 3) % NPAL], x + GPU / 2, y + GPU - 5, (long long)(r % ep));
      if (cp > 1 && g % cp != cp - 1 && j + 1 < gpn) /* the next rank is in the same CP group */
        fprintf(f, "<line class=\"cp\" x1=\"%d\" y1=\"%d\" x2=\"%d\" y2=\"%d\"/>\n", x + GPU / 2, y - 2,
                x + GPU + GAP + GPU / 2, y - 2);
    }
    fputs("</g>\n", f);
  }
  if (shown < nodes)
    fprintf(f, "<text x=\"10\" y=\"%d\">&#8230; and %lld more nodes in the same pattern</text>\n", h - 6,
            (long long)(nodes - shown));
  fputs("</svg>\n", f);
}
