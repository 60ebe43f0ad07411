-- tasks/ebook.py's pandoc filter. Filters run before --shift-heading-level-by, so a chapter
-- is still the manuscript's level-2 heading here.

-- A book is its prose: an image or a link in the manuscript (an imported one may have them)
-- keeps its text and loses its target, which no book file can carry (a missing image or
-- file makes the EPUB invalid; --sandbox never reads the file anyway).
function Image(image)
  return image.caption
end

function Link(link)
  return link.content
end

-- In the DOCX every chapter starts on a new page (the title keeps the first).
function Header(heading)
  if FORMAT == "docx" and heading.level == 2 then
    return {pandoc.RawBlock("openxml", '<w:p><w:r><w:br w:type="page"/></w:r></w:p>'), heading}
  end
end
