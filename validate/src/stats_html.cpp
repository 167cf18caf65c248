// stats --html: one self-contained page. Thumbnails are PNG data: URIs drawn by the contact
// sheet's tile code (DrawTile), so the page references nothing outside itself.
#include <algorithm>
#include <cstdio>
#include <sstream>

#include "shardfeed/validate/inspect.h"
#include "shardfeed/validate/stats.h"

namespace shardfeed::validate {
namespace {

constexpr uint32_t kTile = 96;

std::string Escape(const std::string& text) {
  std::string out;
  for (char c : Printable(text)) {
    switch (c) {
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '&':
        out += "&amp;";
        break;
      case '"':
        out += "&quot;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

std::string Base64(const std::vector<uint8_t>& data) {
  static const char* k = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  out.reserve((data.size() + 2) / 3 * 4);
  for (size_t i = 0; i < data.size(); i += 3) {
    uint32_t v = uint32_t(data[i]) << 16;
    if (i + 1 < data.size()) v |= uint32_t(data[i + 1]) << 8;
    if (i + 2 < data.size()) v |= data[i + 2];
    out += k[(v >> 18) & 63];
    out += k[(v >> 12) & 63];
    out += i + 1 < data.size() ? k[(v >> 6) & 63] : '=';
    out += i + 2 < data.size() ? k[v & 63] : '=';
  }
  return out;
}

// An <img> of sample `index` (a red tile when it does not decode), captioned.
std::string Thumb(const format::Archive& archive, uint64_t index, const std::string& caption,
                  uint64_t max_pixels) {
  imaging::Image img, tile;
  const bool ok = DecodeSample(archive, index, &img, max_pixels).ok();
  tile.Resize(kTile, kTile, 3);
  DrawTile(&tile, 0, 0, kTile, ok ? &img : nullptr);
  auto png = imaging::EncodePng(tile);
  std::string src = png.ok() ? "data:image/png;base64," + Base64(*png) : "";
  return "<figure><img width=\"" + std::to_string(kTile) + "\" height=\"" + std::to_string(kTile) +
         "\" alt=\"sample " + std::to_string(index) + "\" src=\"" + src + "\"><figcaption>" +
         Escape(caption) + "</figcaption></figure>";
}

std::string Bars(const char* title, const Histogram& h) {
  std::ostringstream o;
  uint64_t top = 1;
  for (uint64_t c : h.counts) top = std::max(top, c);
  const int bar = 28, height = 120;
  const int width = int(h.counts.size()) * bar;
  o << "<div class=\"hist\"><h3>" << title << "</h3><svg width=\"" << width << "\" height=\""
    << height + 30 << "\" xmlns=\"http://www.w3.org/2000/svg\">";
  for (size_t i = 0; i < h.counts.size(); ++i) {
    const int bh = int(double(h.counts[i]) / top * height);
    char label[32];
    std::snprintf(label, sizeof(label), "%g", h.edges[i]);
    o << "<rect x=\"" << i * bar + 2 << "\" y=\"" << height - bh << "\" width=\"" << bar - 4
      << "\" height=\"" << bh << "\" fill=\"#4a7ab5\"><title>" << label << ": " << h.counts[i]
      << "</title></rect><text x=\"" << i * bar + 2 << "\" y=\"" << height + 14
      << "\" font-size=\"9\">" << label << "</text>";
  }
  o << "</svg><p>min " << h.min << ", max " << h.max << ", mean " << h.mean << "</p></div>";
  return o.str();
}

}  // namespace

Result<std::string> StatsHtml(const StatsReport& r, const format::Archive& archive,
                              const std::vector<OtherArchive>& against, uint32_t max_items) {
  const uint64_t max_pixels = r.options.max_pixels;
  std::ostringstream o;
  o << "<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>shardfeed stats: "
    << Escape(r.archive) << "</title><style>"
    << "body{font-family:sans-serif;margin:1em}figure{display:inline-block;margin:3px;"
    << "text-align:center;font-size:11px}.group{border:1px solid #ccc;margin:4px;padding:4px;"
    << "display:inline-block}.hist{display:inline-block;margin-right:2em}"
    << "td,th{padding:2px 8px;text-align:left}</style></head><body>\n";
  o << "<h1>shardfeed stats</h1><p>" << Escape(r.archive) << ": " << r.samples << " samples, "
    << r.decoded << " decoded</p>\n<table><tr><th></th><th>R</th><th>G</th><th>B</th></tr>";
  o << "<tr><td>mean (0-1)</td><td>" << r.mean[0] << "</td><td>" << r.mean[1] << "</td><td>"
    << r.mean[2] << "</td></tr><tr><td>std (0-1)</td><td>" << r.std[0] << "</td><td>" << r.std[1]
    << "</td><td>" << r.std[2] << "</td></tr></table>\n";
  o << "<h2>Labels</h2><table><tr><th>label</th><th>name</th><th>count</th></tr>";
  for (size_t c = 0; c < r.class_names.size(); ++c) {
    o << "<tr><td>" << c << "</td><td>" << Escape(r.class_names[c]) << "</td><td>"
      << r.label_counts[c] << "</td></tr>";
  }
  o << "</table><p>";
  if (r.class_names.empty()) {
    o << "no class field";
  } else {
    o << "imbalance ratio " << r.imbalance_ratio;
  }
  o << "</p>\n<h2>Sizes</h2>" << Bars("width", r.width) << Bars("height", r.height)
    << Bars("aspect (w/h)", r.aspect) << Bars("record bytes", r.file_bytes) << "<p>grayscale "
    << r.grayscale << ", CMYK " << r.cmyk << ", EXIF-rotated " << r.exif_rotated << "</p>\n";
  auto groups = [&](const char* title, const std::vector<std::vector<uint64_t>>& list) {
    o << "<h2>" << title << " (" << list.size() << " groups)</h2>\n";
    uint32_t shown = 0;
    for (const auto& g : list) {
      if (shown >= max_items) break;
      o << "<div class=\"group\">";
      for (uint64_t i : g) {
        if (shown++ >= max_items) break;
        const int32_t label = archive.Label(i);
        const std::string name = label >= 0 && size_t(label) < r.class_names.size()
                                     ? r.class_names[label]
                                     : std::string("?");
        o << Thumb(archive, i, "#" + std::to_string(i) + " " + name, max_pixels);
      }
      o << "</div>\n";
    }
  };
  groups("Exact duplicates", r.duplicates);
  groups("Duplicates across labels", r.cross_label_duplicates);
  groups("Near duplicates", r.near_duplicates);
  o << "<h2>Quality flags</h2>\n";
  for (auto [name, list] :
       {std::pair{"uniform", &r.uniform}, std::pair{"dark", &r.dark},
        std::pair{"bright", &r.bright}, std::pair{"blurry", &r.blurry},
        std::pair{"extreme aspect", &r.extreme_aspect}, std::pair{"tiny", &r.tiny}}) {
    o << "<h3>" << name << " (" << list->size() << ")</h3><div>";
    for (size_t k = 0; k < list->size() && k < max_items; ++k) {
      o << Thumb(archive, (*list)[k], "#" + std::to_string((*list)[k]), max_pixels);
    }
    o << "</div>\n";
  }
  o << "<h2>Leaks (" << r.leaks.size() << ")</h2>\n";
  // Pairs: two thumbnails each, max_items in all as in every section.
  for (size_t k = 0; k < r.leaks.size() && 2 * k + 2 <= std::max<size_t>(max_items, 2); ++k) {
    const Leak& l = r.leaks[k];
    const format::Archive* other = nullptr;
    for (const auto& a : against) {
      if (a.name == l.other) other = a.archive.get();
    }
    o << "<div class=\"group\">"
      << Thumb(archive, l.index, "#" + std::to_string(l.index), max_pixels);
    if (other) {
      o << Thumb(*other, l.other_index,
                 l.other + " #" + std::to_string(l.other_index) + (l.exact ? " exact" : " near"),
                 max_pixels);
    }
    o << "</div>\n";
  }
  // Once loaded, the page marks what the browser decoded: each <img> with data-decoded, the
  // body with data-images="decoded/total" (what tests/cli/test_stats_html.py reads back from
  // headless Chromium). Inline: the page still references nothing outside itself.
  o << "<script>addEventListener('load',function(){var n=0,ok=0;"
    << "for(var i of document.images){n++;if(i.complete&&i.naturalWidth>0){ok++;"
    << "i.setAttribute('data-decoded','1')}}"
    << "document.body.setAttribute('data-images',ok+'/'+n)})</script>\n";
  o << "</body></html>\n";
  return o.str();
}

}  // namespace shardfeed::validate
