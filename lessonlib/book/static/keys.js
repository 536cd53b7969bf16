// Keys stay inside the widget (%(uid)s is replaced by its element id). JupyterLab and Notebook 7, in
// command mode, act on keys pressed where focus is on a control that is not a text field (a slider, a
// radio button, a drop-down): the arrows move to another cell and "d d" deletes one. The box is marked
// with the attribute Lumino's command registry honours, and a key a control uses (arrows, Home, End,
// Page Up/Down, Space, Enter, a typed character) does not bubble past the box. Shift+Enter still runs the cell.
(function(box){box.setAttribute("data-lm-suppress-shortcuts","true");
var nav=["ArrowLeft","ArrowRight","ArrowUp","ArrowDown","Home","End","PageUp","PageDown"," ","Enter","Backspace","Delete"];
box.addEventListener("keydown", function(e){var t=e.target;
 if(!t.matches||!t.matches("input, select, textarea, button")||e.ctrlKey||e.metaKey||e.altKey){return;}
 if(e.key==="Enter"&&e.shiftKey){return;}
 if(nav.indexOf(e.key)>=0||e.key.length===1){e.stopPropagation();}});
})(document.getElementById("%(uid)s"));
