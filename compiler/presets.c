/* presets.c — cluster presets: files under specs/clusters/, with copies built into mtc so
 * that a spec anywhere can name one. */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "mtc.h"

#define PRESET_TOP "a cluster preset: a mapping of cluster keys (gpus_per_node, gpu, host, links)"

static bool valid_name(const char *n) {
  if (!n[0] || strlen(n) > 64) return false;
  for (const char *c = n; *c; c++)
    if (!((*c >= 'a' && *c <= 'z') || (*c >= '0' && *c <= '9') || *c == '-' || *c == '_' || *c == '.'))
      return false;
  return n[0] != '.';
}

/* Parses a preset file if it exists; *found tells whether it did. */
static YNode *try_file(Mem *m, Diag *d, const char *path, bool *found) {
  *found = access(path, R_OK) == 0;
  if (!*found) return NULL;
  const Source *src = diag_read_source(m, d, path, YAML_MAX_FILE, "a cluster preset (YAML)");
  return src ? yaml_parse(m, d, src, PRESET_TOP) : NULL;
}

YNode *preset_load(Mem *m, Diag *d, const char *name, const char *spec_path, Loc at) {
  if (!valid_name(name))
    return diag_error(d, at, "'%s' is not a preset name; expected lower-case letters, digits "
                             "and '-', such as jupiter-booster", name), NULL;
  bool found;
  const char *dir = getenv("MTC_PRESET_DIR");
  if (dir && dir[0]) {
    YNode *n = try_file(m, d, mem_printf(m, "%s/%s.yaml", dir, name), &found);
    if (found) return n;
  }
  if (spec_path) {
    const char *slash = strrchr(spec_path, '/');
    char *path = slash ? mem_printf(m, "%.*s/clusters/%s.yaml", (int)(slash - spec_path), spec_path, name)
                       : mem_printf(m, "clusters/%s.yaml", name);
    YNode *n = try_file(m, d, path, &found);
    if (found) return n;
  }
  for (int i = 0; i < preset_count; i++)
    if (strcmp(preset_files[i].name, name) == 0) {
      const PresetFile *p = &preset_files[i];
      return yaml_parse(m, d, diag_source(m, p->path, p->text, p->len), PRESET_TOP);
    }
  char *list = "";
  for (int i = 0; i < preset_count; i++)
    list = mem_printf(m, "%s%s%s", list, i ? ", " : "", preset_files[i].name);
  diag_error(d, at, "unknown cluster preset '%s'; expected one of: %s (specs/clusters/NAME.yaml, "
                    "or a file in $MTC_PRESET_DIR)", name, list);
  return NULL;
}
